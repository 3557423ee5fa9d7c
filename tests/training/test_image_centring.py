"""Document centring of the image encoder (issue #33): what a document's images share is removed,
using only that document, the same way in a batch as one document at a time."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.model import ImageEncoder, ModelConfig, MulLink, document_means, document_medians


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.integers(0, 1000))
def test_document_means_match_a_loop_over_documents(counts, seed):
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(sum(counts), 3)))
    got = document_means(x, counts)
    start = 0
    for n in counts:
        expect = x[start : start + n].mean(0)
        assert torch.allclose(got[start : start + n], expect.expand(n, 3))
        start += n


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=8), st.integers(0, 1000))
def test_document_medians_match_numpys_median_of_each_document(counts, seed):
    """Documents of 0-7 images (even counts: the mean of the two middle values), one sort a batch."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(sum(counts), 3)).round(1)  # ties too
    got = document_medians(torch.from_numpy(x), counts).numpy()
    assert got.shape == x.shape
    start = 0
    for n in counts:
        if n:
            assert np.allclose(got[start : start + n], np.median(x[start : start + n], 0))
        start += n
    two = rng.normal(size=(2, 3))  # None: one document; two images' median is their mean
    assert np.allclose(document_medians(torch.from_numpy(two), None).numpy(), two.mean(0))


@pytest.mark.parametrize("centre", [document_means, document_medians])
def test_a_documents_centre_reads_nothing_back_from_the_device(centre):
    """A meta tensor has shapes and no values, so reading any of its values on the host fails:
    the centres find each row's document and the longest document from the batch's list of image
    counts, so on a GPU a batch costs no synchronisation (``repeat_interleave`` without its output
    size and ``counts.max()`` each copied a value back)."""
    x = torch.empty(7, 5, device="meta")
    assert centre(x, [3, 4]).shape == (7, 5) and centre(x, None).shape == (7, 5)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("centre", [document_means, document_medians])
def test_image_counts_that_do_not_match_the_rows_are_refused_on_the_host(centre, device):
    """With its output size given, ``repeat_interleave`` trusts the counts on a GPU (and on a meta
    tensor: it raised nothing before this check) where a CPU checks them: one check on the host
    list, for every device."""
    x = torch.zeros(7, 5, device=device)
    for counts in ([3, 3], [4, 4], [8]):
        with pytest.raises(ValueError, match="image counts sum to"):
            centre(x, counts)


def test_one_odd_image_does_not_move_the_median_beyond_the_other_images():
    """Issue #60: a document whose images share a look but one is odd (a close-up among room shots).
    The mean follows the odd image out of the others' range, so centring on it leaves every other
    image a share of the odd one; the median stays inside the others' range, channel by channel."""
    rng = np.random.default_rng(0)
    others = torch.from_numpy(rng.normal(size=(4, 8)))
    odd = torch.from_numpy(40 * rng.normal(size=(1, 8)))
    doc = torch.cat([odd, others])
    median, mean = document_medians(doc, [5])[0], document_means(doc, [5])[0]
    low, high = others.min(0).values, others.max(0).values
    assert ((median >= low) & (median <= high)).all()
    assert ((mean < low) | (mean > high)).sum() >= 6  # the mean leaves it on most channels


def _encoder(centring: str, dim: int = 6, centre: str = "mean") -> ImageEncoder:
    torch.manual_seed(0)
    enc = ImageEncoder(
        ModelConfig(
            vocab_size=2,
            image_dim=dim,
            d_multi=4,
            image_dropout=0.0,
            image_centring=centring,
            image_centre=centre,
        )
    )
    rng = np.random.default_rng(1)
    enc.set_feature_stats(
        rng.normal(size=dim),
        rng.uniform(0.5, 2, size=dim),
        rng.uniform(0.1, 1, size=dim),
        rng.uniform(1, 3, size=dim),
    )
    return enc.eval()


def test_a_look_shared_by_a_documents_images_does_not_reach_a_centred_encoder():
    enc = _encoder("doc")
    x = torch.randn(4, 6)
    look = 25 * torch.randn(6)
    assert torch.allclose(enc(x), enc(x + look), atol=1e-5)
    raw = _encoder("none")
    assert not torch.allclose(raw(x), raw(x + look), atol=1e-2)  # the paper's encoder sees it


@pytest.mark.parametrize("centre", ["mean", "median"])
def test_a_batch_is_centred_per_document_as_each_document_alone(centre):
    for centring in ("doc", "doc+raw", "balanced"):
        enc = _encoder(centring, centre=centre)
        a, b = torch.randn(3, 6), torch.randn(5, 6) + 4
        batch = enc(torch.cat([a, b]), [3, 5])
        assert torch.allclose(batch, torch.cat([enc(a), enc(b)]), atol=1e-6)


def test_a_median_centred_encoder_keeps_the_other_images_where_they_were_when_one_turns_odd():
    """The encoder end to end: when one image of a six-image document becomes an outlier, the
    other five move far less with the median than with the mean (their sums of distances)."""
    torch.manual_seed(10)
    x = torch.randn(6, 6)
    odd = x.clone()
    odd[0] += 30 * torch.randn(6)
    moved = {}
    for centre in ("mean", "median"):
        enc = _encoder("balanced", centre=centre)
        with torch.no_grad():
            moved[centre] = float((enc(odd)[1:] - enc(x)[1:]).norm(dim=-1).sum())
    assert moved["median"] < 0.5 * moved["mean"], moved


@pytest.mark.parametrize("bad", ["middle", ""])
def test_an_unknown_centre_is_refused(bad):
    with pytest.raises(ValueError, match="image centre"):
        ImageEncoder(
            ModelConfig(vocab_size=2, image_dim=3, d_multi=2, image_centring="doc", image_centre=bad)
        )


def test_configs_saved_before_the_median_centre_on_the_mean_and_new_runs_on_the_median():
    from training.config import TrainConfig

    saved = ModelConfig(vocab_size=2, image_centring="balanced").to_dict()
    saved.pop("image_centre")
    assert ModelConfig(**saved).image_centre == "mean"
    assert TrainConfig(data="d").image_centre == "median"


def test_the_raw_part_keeps_a_single_image_document_apart_from_the_others():
    enc = _encoder("doc+raw")
    one, other = enc(torch.randn(1, 6)), enc(torch.randn(1, 6))
    assert not torch.allclose(one, other)
    assert torch.isfinite(_encoder("doc")(torch.randn(1, 6))).all()


def test_models_saved_before_centring_load_and_score_as_before():
    cfg = ModelConfig(vocab_size=5, word_dim=4, image_dim=6, d_multi=4)
    old = MulLink(cfg).eval()
    state = {k: v for k, v in old.state_dict().items()}
    assert not any("centred" in k for k in state)
    saved = cfg.to_dict()
    saved.pop("image_centring")  # a config written before the option existed
    again = MulLink(ModelConfig(**saved)).eval()
    again.load_state_dict(state)  # strict: no new buffer for the old encoder
    tokens, lengths, feats = torch.tensor([[1, 2, 3]]), torch.tensor([3]), torch.randn(2, 6)
    with torch.no_grad():
        scores = [m.text(tokens, lengths) @ m.image(feats).T for m in (old, again)]
    assert np.allclose(*scores)


def test_the_mean_weight_scales_the_document_part_only():
    """Balanced at weight 0 is the within-document part alone ("doc"); a config saved before the
    weight existed keeps the 0.5 it was trained with."""
    torch.manual_seed(0)
    kw = dict(vocab_size=2, image_dim=6, d_multi=4, image_dropout=0.0)
    zero = ImageEncoder(ModelConfig(**kw, image_centring="balanced", image_mean_weight=0.0)).eval()
    doc = ImageEncoder(ModelConfig(**kw, image_centring="doc")).eval()
    doc.load_state_dict(zero.state_dict(), strict=False)  # same projection, no between_std
    x = torch.randn(4, 6)
    assert torch.allclose(zero(x), doc(x), atol=1e-6)
    one = ImageEncoder(ModelConfig(**kw, image_centring="balanced", image_mean_weight=1.0)).eval()
    one.load_state_dict(zero.state_dict())
    assert not torch.allclose(one(x), zero(x), atol=1e-3)  # the document's look now counts
    saved = ModelConfig(**kw, image_centring="balanced").to_dict()
    saved.pop("image_mean_weight")
    assert ModelConfig(**saved).image_mean_weight == 0.5


@pytest.mark.parametrize("bad", ["mean", ""])
def test_an_unknown_centring_is_refused(bad):
    with pytest.raises(ValueError, match="image centring"):
        ImageEncoder(ModelConfig(vocab_size=2, image_dim=3, d_multi=2, image_centring=bad))


def test_balanced_reads_the_within_part_and_the_half_weighted_mean_part_through_one_projection():
    enc = _encoder("balanced")
    x = torch.randn(4, 6)
    z = (x - enc.feature_mean) / enc.feature_std
    mean = z.mean(0, keepdim=True)
    expect = (z - mean) / enc.centred_std + 0.5 * mean / enc.between_std
    got = enc(x)
    assert torch.allclose(got, torch.nn.functional.normalize(enc.proj(expect), dim=-1), atol=1e-6)
    # the look enters only through the mean part: scaled down by the between-document spread
    look = 25 * torch.randn(6)
    assert (enc(x + look) - enc(x)).abs().max() > 1e-3  # not invariant, unlike "doc"


def test_the_training_statistics_give_the_within_and_between_spreads(tmp_path):
    from schemas.document import Document, ImageRecord
    from schemas.shards import write_shard
    from training.driver import training_feature_stats

    rng = np.random.default_rng(0)
    docs, all_z = [], []
    for d in range(30):
        look = rng.normal(size=3) * 5
        feats = look + rng.normal(size=(4, 3))
        docs.append(
            Document(
                f"d{d}",
                "s",
                "train",
                ["a"],
                [ImageRecord("c", "u", 1, 1, 0, list(map(float, f))) for f in feats],
            )
        )
        all_z.append(feats)
    path = tmp_path / "train.parquet"
    write_shard(path, docs)
    allx = np.concatenate(all_z)
    z = [(f - allx.mean(0)) / allx.std(0) for f in all_z]
    for centre, look in (("mean", lambda f: f.mean(0)), ("median", lambda f: np.median(f, 0))):
        _, _, centred, between = training_feature_stats([str(path)], centred=True, centre=centre)
        within = np.concatenate([f - look(f) for f in z])  # as the encoder centres each document
        assert np.allclose(centred, np.sqrt(np.mean(within**2, 0)), rtol=1e-4), centre
        assert np.allclose(between, np.sqrt(np.mean(np.stack([look(f) for f in z]) ** 2, 0)), rtol=1e-4)
        assert (between > 2 * centred).all()  # the look dominates here
