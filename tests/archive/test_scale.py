"""The archive index at scale (issue #38): add and delete against brute-force search over the
live images, the versioned and fingerprinted folder, the string tables and id look-up, the
memory-mapped load, and the streamed build, resumed after a real kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archive.build import CHUNK_IMAGES, ArchiveChunk, build_streamed
from archive.index import ArchiveIndex
from archive.store import (
    IdLookup,
    StringTable,
    VectorFile,
    append_table,
    chained,
    hash_ids,
    truncate_table,
)
from schemas.errors import MmlinksError

ROOT = Path(__file__).resolve().parents[3]


def vectors_source(
    ids: list[str], vectors: np.ndarray, uris: list[str] | None = None, chunk: int = CHUNK_IMAGES
):
    """A build source over arrays in memory, positions = rows."""
    uris = list(uris) if uris is not None else [""] * len(ids)

    def source(start: int):
        for s in range(start, len(ids), chunk):
            e = min(len(ids), s + chunk)
            yield ArchiveChunk(list(ids[s:e]), vectors[s:e], uris[s:e], e)

    return source


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _exact_everything(index: ArchiveIndex) -> None:
    """Probe every cell and re-rank every row on both stores: ivfpq is then exact."""
    if index.kind == "ivfpq":
        cells = int(faiss.downcast_index(index.index.base_index).nlist)
        index.set_search(nprobe=cells, k_factor=index.rows, exact_factor=index.rows)


def _check_against_brute_force(index: ArchiveIndex, names: list[str], x: np.ndarray, q: np.ndarray, k: int):
    """Every query's hits are the best k live rows: scores as brute force's, each id its own."""
    live = {n: i for i, n in enumerate(names) if index.is_live(i)}
    v = x
    rows = np.array(sorted(live.values()), dtype=np.int64)
    scores, got = index.search(q, k)
    kk = min(k, len(rows))
    assert scores.shape == (len(q), kk)
    for i in range(len(q)):
        brute = v[rows] @ q[i]
        np.testing.assert_allclose(scores[i], np.sort(brute)[::-1][:kk], atol=1e-4)
        assert len(got[i]) == kk and len(set(got[i])) == kk and set(got[i]) <= set(live)
        own = np.array([v[live[n]] @ q[i] for n in got[i]])
        np.testing.assert_allclose(own, scores[i], atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["flat", "ivfpq"]),
    start=st.integers(1, 40),
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 12)), min_size=1, max_size=6),
    k=st.integers(1, 15),
    seed=st.integers(0, 2**16),
)
def test_adds_and_deletes_leave_the_top_k_of_exact_search_over_the_live_images(kind, start, steps, k, seed):
    rng = np.random.default_rng(seed)
    d = 8
    names = [f"img-{i}" for i in range(start)]
    x = _unit(rng, start, d)
    index = ArchiveIndex.build(names, x, kind=kind)
    _exact_everything(index)
    version, prints = 1, {index.fingerprint}
    for is_add, n in steps:
        live = [nm for i, nm in enumerate(names) if index.is_live(i)]
        if is_add or len(live) <= 1:
            new = [f"img-{len(names) + i}" for i in range(n)]
            vecs = _unit(rng, n, d)
            index.add(new, vecs, [f"u/{nm}" for nm in new])
            names += new
            x = np.concatenate([x, vecs])
        else:
            gone = list(rng.choice(live, size=min(n, len(live) - 1), replace=False))
            index.delete(gone)
        version += 1
        assert index.version == version and index.fingerprint not in prints
        prints.add(index.fingerprint)
        _exact_everything(index)
    assert len(index) == sum(index.is_live(i) for i in range(len(names)))
    _check_against_brute_force(index, names, x, _unit(rng, 3, d), k)


def test_a_withdrawn_image_is_never_returned_and_may_come_back(tmp_path):
    rng = np.random.default_rng(3)
    x = _unit(rng, 200, 16)
    names = [f"c{i}" for i in range(200)]
    for kind in ("flat", "hnsw", "ivf", "pq", "ivfpq"):
        index = ArchiveIndex.build(names, x, [f"u{i}" for i in range(200)], kind, {"run_id": "r"})
        index.delete(["c0", "c1", "c7"])
        assert len(index) == 197 and index.rows == 200 and index.version == 2
        hits = index.search(x[[0, 1, 7, 9]], 5)[1]
        assert not {"c0", "c1", "c7"} & {h for row in hits for h in row}
        assert hits[3][0] == "c9"
        back = ArchiveIndex.load(index.save(tmp_path / kind))  # the tombstones are in the folder
        assert back.search(x[[0, 9]], 5)[1] == index.search(x[[0, 9]], 5)[1] and len(back) == 197
        assert (back.version, back.fingerprint, back.info) == (2, index.fingerprint, {"run_id": "r"})
        if kind != "hnsw":
            back.add(["c1"], x[1:2], ["again"])  # a withdrawn image comes back, as a new row
            assert back.search(x[1:2], 1)[1] == [["c1"]] and back.uris[200] == "again" and len(back) == 198
        meta = json.loads((tmp_path / kind / "index.json").read_text())
        assert meta["size"] == 197 and meta["deleted"] == 3 and meta["version"] == 2


def test_bad_adds_and_deletes_are_one_line_errors():
    rng = np.random.default_rng(4)
    index = ArchiveIndex.build(["a", "b", "c"], _unit(rng, 3, 4))
    before = (index.version, index.fingerprint)
    cases = [
        (lambda: index.add(["b"], _unit(rng, 1, 4)), "1 ids already in the archive"),
        (lambda: index.add(["x", "x"], _unit(rng, 2, 4)), "given twice"),
        (lambda: index.add(["x"], _unit(rng, 1, 5)), "4-d index"),
        (lambda: index.delete(["zz"]), "1 ids not in the archive"),
    ]
    for call, message in cases:
        with pytest.raises(MmlinksError, match=message):
            call()
    assert (index.version, index.fingerprint, len(index)) == (*before, 3)
    index.delete(["b"])
    with pytest.raises(MmlinksError, match="not in the archive"):
        index.delete(["b"])  # already withdrawn
    with pytest.raises(MmlinksError, match="ivfpq only"):
        index.set_search(nprobe=2)


@settings(max_examples=40, deadline=None)
@given(strings=st.lists(st.text(max_size=12), max_size=30), extra=st.lists(st.text(max_size=5), max_size=5))
def test_a_string_table_reads_back_every_row(tmp_path_factory, strings, extra):
    folder = tmp_path_factory.mktemp("table")
    StringTable(strings).write(folder, "names")
    table = StringTable.open(folder, "names")
    assert list(table) == strings and len(table) == len(strings)
    table.extend(extra)  # opened rows + rows in memory, written again over the mapped files
    table.write(folder, "names")
    assert list(StringTable.open(folder, "names")) == strings + extra
    append_table(folder, "names", ["tail"])
    truncate_table(folder, "names", len(strings))
    assert list(StringTable.open(folder, "names")) == strings
    if strings:
        assert table[-1] == (strings + extra)[-1] and table[0] == strings[0]


def test_the_id_look_up_confirms_a_hash_hit_on_the_string():
    table = StringTable(["a", "b", "c"])
    h = hash_ids(["a", "b", "c"])
    lookup = IdLookup()
    lookup.insert(np.array([h[0], h[0], h[2]], np.uint64), np.array([0, 1, 2]))  # b hashed as a
    collide = np.array([h[0], h[0], h[2], h[0]], np.uint64)  # b and d collide with a
    assert lookup.find(["a", "b", "c", "d"], table, hashes=collide).tolist() == [0, 1, 2, -1]
    assert lookup.find(["a"], table, alive=lambda r: r != 0).tolist() == [-1]
    assert IdLookup.of(table).find(["c", "b"], table).tolist() == [2, 1]
    assert chained("", "add", ["ab", "c"]) != chained("", "add", ["a", "bc"])  # length-prefixed


def test_a_folder_of_issue_18_still_loads(tmp_path):
    rng = np.random.default_rng(5)
    x = _unit(rng, 20, 8)
    index = faiss.IndexFlatIP(8)
    index.add(x)
    faiss.write_index(index, str(tmp_path / "index.faiss"))
    names = {"ids": [f"o{i}" for i in range(20)], "uris": [f"u{i}" for i in range(20)]}
    (tmp_path / "ids.json").write_text(json.dumps(names))
    (tmp_path / "index.json").write_text(json.dumps({"kind": "flat", "dim": 8, "size": 20, "run_id": "r0"}))
    old = ArchiveIndex.load(tmp_path)
    assert len(old) == 20 and old.uris[4] == "u4" and old.info == {"run_id": "r0"} and old.version == 1
    assert old.search(x[3:4], 1)[1] == [["o3"]]
    old.delete(["o3"])
    back = ArchiveIndex.load(old.save(tmp_path))  # saved over in the new layout
    assert not (tmp_path / "ids.json").exists() and back.search(x[3:4], 1)[1] != [["o3"]]


def test_a_memory_mapped_index_searches_alike_and_refuses_to_grow(tmp_path):
    rng = np.random.default_rng(6)
    x = _unit(rng, 500, 16)
    index = ArchiveIndex.build([str(i) for i in range(500)], x, kind="ivfpq")
    index.set_search(nprobe=3, k_factor=7)
    index.delete(["4"])
    mapped = ArchiveIndex.load(index.save(tmp_path / "ix"), mmap=True)
    assert mapped.search(x[:20], 10)[1] == index.search(x[:20], 10)[1]
    assert (mapped.nprobe, mapped.refine_factor, mapped.kind) == (3, 7, "ivfpq")  # saved with it
    with pytest.raises(MmlinksError, match="memory-mapped"):
        mapped.add(["new"], x[:1])
    mapped.delete(["5"])  # tombstones need no write to the mapped arrays
    assert "5" not in mapped.search(x[5:6], 3)[1][0]
    with pytest.raises(MmlinksError, match=r"nprobe must be an integer in 1\.\."):
        mapped.set_search(nprobe=0)


def test_a_served_mapped_index_holds_its_store_and_names_in_memory_and_finds_the_same(tmp_path, monkeypatch):
    from models.news_serving import ARCHIVE_ENV, load_archive

    rng = np.random.default_rng(11)
    x = _unit(rng, 600, 16)
    names = [f"img-{i}" for i in range(600)]
    index = ArchiveIndex.build(names, x, [f"uri-{i}" for i in range(600)], kind="ivfpq")
    folder = index.save(tmp_path / "ix")
    assert index.hold_resident() == {}  # nothing of it is mapped from a file
    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    assert load_archive(str(folder), 16, None).resident == {}  # an evaluation's load: left lazy
    served = load_archive(str(folder), 16, None, serving=True)
    # every byte a query touches at random: the 8-bit store's codes (16 a vector) and both
    # name tables (offsets and text), locked or populated, none left out
    tables = ("ids.bin", "ids.offsets", "uris.bin", "uris.offsets")
    want = 600 * 16 + sum((folder / f).stat().st_size for f in tables)
    assert sum(served.resident.values()) == want
    if sys.platform == "linux":
        assert served.resident["failed"] == 0
    plain = ArchiveIndex.load(folder, mmap=True)
    q = x[:20] + 0.1 * _unit(rng, 20, 16)
    got, want_hits = served.search(q, 10), plain.search(q, 10)
    assert got[1] == want_hits[1] and np.array_equal(got[0], want_hits[0])
    assert [served.uris[r] for r in served.search_rows(q, 3)[1][0]] == [
        f"uri-{n.split('-')[1]}" for n in got[1][0][:3]
    ]


def test_reading_vectors_on_disk_and_in_memory_gives_each_row_in_the_order_asked(tmp_path):
    rng = np.random.default_rng(12)
    x = _unit(rng, 50, 8)
    VectorFile(8, x[:40]).write(tmp_path, "v")
    vf = VectorFile.open(tmp_path, "v", 8, 40)
    vf.extend(x[40:45])
    vf.extend(x[45:])
    rows = np.array([44, 3, 3, 39, 0, 49, 17, 40])  # unsorted, repeated, both sides of the file's end
    assert np.array_equal(vf.take(rows), x[rows])
    assert vf.take(np.array([7])).tolist() == x[7:8].tolist()
    assert vf.take(np.zeros(0, np.int64)).shape == (0, 8)


def test_a_folder_whose_files_do_not_belong_together_is_refused(tmp_path):
    """A save or copy cut short: index.json's count, the IVF codes vs the re-rank store, the
    tombstones, the float32 vectors the search re-ranks on; and the vectors a loaded index
    reads stay its own when the file at their path is replaced."""
    rng = np.random.default_rng(9)
    x = _unit(rng, 300, 16)
    index = ArchiveIndex.build([str(i) for i in range(300)], x, kind="ivfpq")
    index.set_search(nprobe=2, k_factor=5, exact_factor=4)
    index.delete(["3"])
    folder = index.save(tmp_path / "ix")
    loaded = ArchiveIndex.load(folder)  # not searched yet
    before = index.search(x[:5], 5)
    meta = json.loads((folder / "index.json").read_text())
    (folder / "vectors.f32").rename(tmp_path / "v.f32")
    with pytest.raises(MmlinksError, match=r"vectors\.f32 is missing"):
        ArchiveIndex.load(folder)
    (folder / "vectors.f32").write_bytes(np.zeros((300, 16), "<f4").tobytes())  # replaced
    after = loaded.search(x[:5], 5)  # it reads the file it opened, not the zeros
    assert after[1] == before[1] and np.array_equal(after[0], before[0])
    (tmp_path / "v.f32").replace(folder / "vectors.f32")
    for key, bad, why in (("rows", 299, "counts 299 rows"), ("deleted", 2, "counts 2 withdrawn")):
        (folder / "index.json").write_text(json.dumps({**meta, key: bad}))
        with pytest.raises(MmlinksError, match=f"inconsistent: .*{why}"):
            ArchiveIndex.load(folder)
    (folder / "index.json").write_text(json.dumps(meta))
    np.save(folder / "deleted.npy", np.array([300]))
    with pytest.raises(MmlinksError, match="past the end"):
        ArchiveIndex.load(folder)


def test_the_search_fingerprint_follows_the_search_settings_and_the_fingerprint_the_rows():
    rng = np.random.default_rng(10)
    x = _unit(rng, 300, 16)
    a = ArchiveIndex.build([str(i) for i in range(300)], x, kind="ivfpq")
    b = ArchiveIndex.build([str(i) for i in range(300)], x, kind="ivfpq")
    assert (a.fingerprint, a.search_fingerprint) == (b.fingerprint, b.search_fingerprint)
    b.set_search(nprobe=1)
    assert a.fingerprint == b.fingerprint and a.search_fingerprint != b.search_fingerprint


def test_a_table_whose_data_is_cut_short_is_not_padded_on_resume(tmp_path):
    append_table(tmp_path, "ids", ["a", "bb", "ccc"])
    os.truncate(tmp_path / "ids.bin", 2)  # the offsets claim 6 bytes
    with pytest.raises(MmlinksError, match="cut short"):
        truncate_table(tmp_path, "ids", 3)


def test_the_streamed_build_skips_ids_seen_before_and_trains_on_its_first_vectors(tmp_path):
    rng = np.random.default_rng(7)
    x = _unit(rng, 400, 16)
    names = [f"p{i % 300}" for i in range(400)]  # the last 100 repeat earlier ids
    index = build_streamed(vectors_source(names, x, chunk=64), "ivfpq", {"run_id": "r"}, train_size=100)
    assert len(index) == 300 and list(index.ids) == [f"p{i}" for i in range(300)]
    assert index.search(x[:5], 1)[1] == [[f"p{i}"] for i in range(5)]  # the first occurrence's vector
    with pytest.raises(MmlinksError, match="no image to index"):
        build_streamed(vectors_source([], np.zeros((0, 16), np.float32)), "flat")


BUILD_SCRIPT = """
import sys, numpy as np
from archive.build import build_streamed
from tests.archive.test_scale import vectors_source
rng = np.random.default_rng(11)
x = rng.standard_normal((3000, 16)).astype(np.float32)
x /= np.linalg.norm(x, axis=1, keepdims=True)
ids = [f"img-{i}" for i in range(3000)]
build_streamed(vectors_source(ids, x, [f"u{i}" for i in range(3000)], chunk=250), sys.argv[2],
               {"run_id": "r"}, sys.argv[1], train_size=600, checkpoint_rows=500)
"""


def _build(folder: Path, kind: str, kill: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MMLINKS_TEST_KILL_ARCHIVE_AT", None)
    if kill:
        env["MMLINKS_TEST_KILL_ARCHIVE_AT"] = kill
    cmd = [sys.executable, "-c", BUILD_SCRIPT, str(folder), kind]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("kind", "kill"),
    [("ivfpq", "added:7"), ("ivfpq", "checkpoint:3"), ("ivfpq", "finish:1"), ("hnsw", "added:4")],
)
def test_a_killed_streamed_build_resumes_to_the_index_of_an_uninterrupted_one(tmp_path, kind, kill):
    whole = _build(tmp_path / "whole", kind)
    assert whole.returncode == 0, whole.stderr
    killed = _build(tmp_path / "resumed", kind, kill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    state = json.loads((tmp_path / "resumed" / "build.json").read_text())
    if kill.startswith("finish"):  # every file written, the checkpoint it came from still there
        assert state["rows"] == 3000 and (tmp_path / "resumed" / f"{state['index']}.faiss").is_file()
    else:
        assert 0 < state["rows"] < 3000  # a checkpoint, not the end
        with pytest.raises(MmlinksError, match="unfinished build"):
            ArchiveIndex.load(tmp_path / "resumed")
    again = _build(tmp_path / "resumed", kind)
    assert again.returncode == 0, again.stderr
    a, b = ArchiveIndex.load(tmp_path / "whole"), ArchiveIndex.load(tmp_path / "resumed")
    assert list(a.ids) == list(b.ids) and list(a.uris) == list(b.uris) and len(b) == 3000
    assert a.fingerprint == b.fingerprint and a.version == b.version == 1
    q = _unit(np.random.default_rng(12), 30, 16)
    sa, ra = a.search(q, 10)
    sb, rb = b.search(q, 10)
    assert ra == rb
    np.testing.assert_allclose(sa, sb, atol=1e-6)
    if kind == "ivfpq":  # FAISS adds its codes in order: the same bytes (HNSW inserts in parallel)
        for name in ("index.faiss", "index.refine.faiss", "vectors.f32"):
            files = [(tmp_path / f / name).read_bytes() for f in ("whole", "resumed")]
            assert files[0] == files[1]
        assert np.array_equal(sa, sb)
    assert not list((tmp_path / "resumed").glob("build*"))


def _shards(folder: Path, featureless: bool) -> list[str]:
    """Two shards of 30 documents, two images each; photo ``p{j}`` recurs (ids shared across
    documents and shards); with ``featureless`` one image has no feature vector."""
    from schemas.document import Document, ImageRecord
    from schemas.shards import write_shard

    rng = np.random.default_rng(8)
    feats = {j: rng.standard_normal(6).round(3).tolist() for j in range(45)}
    paths = []
    for s in range(2):
        docs = []
        for i in range(30):
            ims = [(s * 30 + i) % 45, (s * 30 + i * 7) % 45]
            images = [ImageRecord(f"p{j}", f"u/{j}", 8, 8, 0, feats[j]) for j in ims]
            if featureless and s == 1 and i == 3:
                images[0] = ImageRecord("nofeat", "u/x", 8, 8, 0, None)
            docs.append(Document(f"d{s}-{i:02d}", "news-jsonl", "train", ["a b"], images, [(0, 0)]))
        write_shard(folder / f"s{s}.parquet", docs)
        paths.append(str(folder / f"s{s}.parquet"))
    return paths


@pytest.mark.parametrize("featureless", [False, True])
def test_the_shard_source_streams_every_distinct_image_once_and_resumes_at_a_position(tmp_path, featureless):
    from archive.build import archive_images, shard_source

    paths = _shards(tmp_path, featureless)
    source = shard_source(paths, batch_rows=7, chunk_images=10)
    chunks = list(source(0))
    assert len(chunks) > 3 and chunks[-1].end == 60  # positions: documents read
    ids, _, feats = archive_images(paths)
    index = build_streamed(source, "flat", train_size=1)
    assert sorted(index.ids) == sorted(ids) and len(index) == len(ids) and "nofeat" not in index.ids
    got = dict(zip(index.ids, index.vectors(np.arange(index.rows)).tolist(), strict=True))
    want = dict(zip(ids, feats.tolist(), strict=True))
    assert all(np.allclose(got[i], want[i], atol=1e-6) for i in ids)  # the image's own features
    later = list(source(chunks[1].end))  # a resumed build's read: the chunks after a position
    assert [c.ids for c in later] == [c.ids for c in chunks[2:]] and later[-1].end == 60


def test_calibration_probes_a_few_cells_of_clustered_vectors_and_more_of_random_ones(tmp_path):
    rng = np.random.default_rng(9)
    centres = _unit(rng, 40, 32)
    x = centres[rng.integers(0, 40, 6000)] + 0.05 * rng.standard_normal((6000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = [str(i) for i in range(6000)]
    clustered = build_streamed(
        vectors_source(ids, x, chunk=2000), "ivfpq", folder=tmp_path / "c", train_size=6000
    )
    random = build_streamed(vectors_source(ids, _unit(rng, 6000, 32), chunk=2000), "ivfpq", train_size=6000)
    cells = int(faiss.downcast_index(clustered.index.base_index).nlist)
    for index in (clustered, random):  # the measured recall reaches the target, at what was chosen
        cal = index.calibration
        assert cal["recall"] >= 0.97 and cal["query_source"] == "noisy database vectors"
        assert cal["measured"][f"nprobe={index.nprobe} k_factor={index.refine_factor}"] == cal["recall"]
    assert clustered.nprobe < cells / 4 and random.nprobe > clustered.nprobe
    saved = json.loads((tmp_path / "c" / "index.json").read_text())
    assert saved["search"]["nprobe"] == clustered.nprobe and saved["calibration"] == clustered.calibration
    cal = clustered.calibrate(0.9, queries=x[:50] + 0.1)  # the served model's queries, when known
    assert cal["query_source"] == "given" and cal["queries"] == 50 and cal["recall"] >= 0.9
