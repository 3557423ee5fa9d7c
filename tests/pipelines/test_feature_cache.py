"""The per-image feature cache and the build's look-up DoFn over it (pipelines/feature_cache.py,
pipelines/feature_steps.py): round trips, torn entries, and a look-up that splits hits and misses
the same way when it is re-run after the build has written entries of its own (issue #35's CI
failure: Dask re-runs a dead worker's look-up after part of its outputs were consumed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from features import ImageFeatures
from pipelines.feature_cache import FeatureCache, cache_key, decode, encode
from pipelines.feature_steps import LookUpFeatureCache

KEY = cache_key("efficientnet-lite0", "v1", "cpu", {})


def feats(seed: int) -> ImageFeatures:
    return ImageFeatures(features=np.random.default_rng(seed).normal(size=8).astype(np.float32), regions=None)


def split(dofn: LookUpFeatureCache, ids: list[str]) -> tuple[list[str], list[str]]:
    hits, misses = [], []
    for cid in ids:
        for out in dofn.process(cid):
            if getattr(out, "tag", None) == LookUpFeatureCache.MISS:
                misses.append(out.value)
            else:
                hits.append(out[0])
    return hits, misses


@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=16), st.one_of(st.none(), st.text()))
def test_an_entry_reads_back_equal_whoever_wrote_it(values, writer):
    got = decode(encode(ImageFeatures(features=np.asarray(values, np.float32), regions=None), writer))
    np.testing.assert_array_equal(got.features, np.asarray(values, np.float32))
    assert got.regions is None


def test_a_torn_entry_is_a_miss_and_a_put_overwrites_it(tmp_path):
    cache = FeatureCache(str(tmp_path), KEY)
    cache.put("ab" * 32, feats(0))
    uri = tmp_path / "features" / KEY / "ab" / f"{'ab' * 32}.npz"
    uri.write_bytes(uri.read_bytes()[:20])
    assert cache.get("ab" * 32) is None
    cache.put("ab" * 32, feats(1))
    np.testing.assert_array_equal(cache.get("ab" * 32).features, feats(1).features)


def test_a_build_does_not_see_its_own_entries_but_the_next_build_does(tmp_path):
    cache = FeatureCache(str(tmp_path), KEY)
    cache.put("cd" * 32, feats(2), written_by="build-1")
    assert cache.get("cd" * 32, unless_written_by="build-1") is None
    later = cache.get("cd" * 32, unless_written_by="build-2")
    np.testing.assert_array_equal(later.features, feats(2).features)
    np.testing.assert_array_equal(cache.get("cd" * 32).features, feats(2).features)


@pytest.mark.parametrize("earlier", [None, "an-earlier-build"])
def test_a_rerun_look_up_splits_as_the_first_run_did_after_the_build_wrote_features(tmp_path, earlier):
    ids = [f"{i:02x}" * 32 for i in range(6)]
    cache = FeatureCache(str(tmp_path), KEY)
    cache.put(ids[0], feats(0), written_by=earlier)  # cached before this build started
    look = LookUpFeatureCache(str(tmp_path), KEY, build="this-build")
    look.setup()
    first = split(look, ids)
    assert first == (ids[:1], ids[1:])
    for i, cid in enumerate(ids[1:4]):  # the build's StoreFeatures writes some misses, then a worker dies
        cache.put(cid, feats(i), written_by="this-build")
    assert split(look, ids) == first  # the re-run of the lost bundle: the same hits and misses
    nxt = LookUpFeatureCache(str(tmp_path), KEY, build="the-next-build")
    nxt.setup()
    assert split(nxt, ids) == (ids[:4], ids[4:])  # a later build uses them
