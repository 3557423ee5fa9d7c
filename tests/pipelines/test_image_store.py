"""The content-addressed image store over real loopback HTTP, local files and an object store;
plus the URI-agnostic file helpers it writes through (pipelines.fileio)."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import pipelines.image_store as image_store
from features.images import InvalidImage
from pipelines import fileio
from pipelines.image_fetch import USER_AGENT, FetchFailed, FileSystemFetcher, HttpFetcher, default_fetcher
from pipelines.image_store import ImageStore, Placeholders, is_blank_phash

LIMIT = 100_000  # the store's byte limit in these tests


# ---------------------------------------------------------------- images


def textured(seed: int, size: int = 64) -> Image.Image:
    """Smooth random colour field plus noise: a real texture with a well-spread phash."""
    rng = np.random.default_rng(seed)
    low = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize(
        (size, size), Image.BILINEAR
    )
    arr = np.asarray(low).astype(int) + rng.integers(-20, 20, (size, size, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def apng() -> bytes:
    frames = [textured(20), textured(21)]
    buf = io.BytesIO()
    frames[0].save(buf, format="PNG", save_all=True, append_images=frames[1:], duration=100)
    return buf.getvalue()


GOOD_PNG = encode(textured(1), "PNG")
GOOD_JPG = encode(textured(2), "JPEG", quality=90)
REMOVED_PNG = encode(textured(3), "PNG")  # what imgur serves for deleted images
PLACEHOLDER = textured(4)
STILL_GIF = encode(textured(5), "GIF")
FLAT_PNG = encode(Image.new("RGB", (64, 64), (200, 30, 30)), "PNG")
TINY_PNG = encode(textured(6, size=8), "PNG")


# ---------------------------------------------------------------- loopback server


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None, length: bool = True):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        srv = self.server
        with srv.lock:
            srv.hits[self.path] += 1
            srv.agents.append(self.headers.get("User-Agent"))
        route = srv.routes.get(self.path)
        if route is None:
            return self._send(404, b"not here")
        kind, payload = route
        if kind == "body":
            return self._send(200, payload, {"Content-Type": "application/octet-stream"})
        if kind == "status":
            return self._send(payload, b"error page")
        if kind == "redirect":
            return self._send(302, b"", {"Location": payload})
        if kind == "stream":  # no Content-Length: the body runs until the connection closes
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for _ in range(payload // 8192):
                    self.wfile.write(b"\0" * 8192)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return None
        if kind == "slow":
            time.sleep(payload)
            return self._send(200, GOOD_PNG)
        raise AssertionError(kind)


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.lock = threading.Lock()
    srv.hits = Counter()
    srv.agents = []
    srv.routes = {
        "/good.png": ("body", GOOD_PNG),
        "/copy.png": ("body", GOOD_PNG),
        "/good.jpg": ("body", GOOD_JPG),
        "/still.gif": ("body", STILL_GIF),
        "/anim.png": ("body", apng()),
        "/gone": ("redirect", "/removed.png"),
        "/removed.png": ("body", REMOVED_PNG),
        "/missing": ("status", 404),
        "/deleted": ("status", 410),
        "/forbidden": ("status", 403),
        "/error": ("status", 500),
        "/big": ("body", b"\0" * (LIMIT + 5000)),
        "/big-stream": ("stream", 4 * LIMIT),
        "/page.html": ("body", b"<html><body>not an image</body></html>"),
        "/flat.png": ("body", FLAT_PNG),
        "/tiny.png": ("body", TINY_PNG),
        "/slow": ("slow", 1.5),
        "/placeholder.jpg": ("body", encode(PLACEHOLDER, "JPEG", quality=85)),
    }
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def decodes(monkeypatch):
    """Counts calls of inspect_image made by the store."""
    calls = []
    real = image_store.inspect_image

    def counting(data):
        calls.append(hashlib.sha256(data).hexdigest())
        return real(data)

    monkeypatch.setattr(image_store, "inspect_image", counting)
    return calls


def make_store(root, **kw) -> ImageStore:
    return ImageStore(
        str(root), max_bytes=LIMIT, fetcher=HttpFetcher(timeout=(2, 0.5), allow_private=True), **kw
    )


def store_files(root) -> list[str]:
    return [p for p in fileio.list_files(str(root), include_temp=True)]


# ---------------------------------------------------------------- good images and caching


def test_good_images_load_once_then_come_from_the_store(tmp_path, server, decodes):
    store = make_store(tmp_path / "store")
    hits = dict(server.hits)
    first = {p: store.load(server.url + p) for p in ("/good.png", "/good.jpg")}
    for p, img in first.items():
        assert not img.cached and (img.width, img.height) == (64, 64)
        assert server.hits[p] == hits.get(p, 0) + 1
        assert not is_blank_phash(img.phash)
        assert img.final_uri == server.url + p
    assert len(decodes) == 2
    assert first["/good.png"].content_id == hashlib.sha256(GOOD_PNG).hexdigest()
    assert store.get_bytes(first["/good.jpg"].content_id) == GOOD_JPG
    cid = first["/good.png"].content_id
    assert fileio.exists(str(tmp_path / "store" / "blobs" / cid[:2] / cid))
    assert store.info(cid) == {
        "content_id": cid,
        "width": 64,
        "height": 64,
        "phash": first["/good.png"].phash,
        "source": server.url + "/good.png",  # where a damaged blob is fetched from again
    }

    # A rebuild (a fresh store object on the same root): no request, no decode.
    again_store = make_store(tmp_path / "store")
    before = sum(server.hits.values())
    for p, img in first.items():
        again = again_store.load(server.url + p)
        assert again.cached and again.data is None
        assert again.to_record() == img.to_record()
        assert again.read_bytes() == img.read_bytes()
    assert sum(server.hits.values()) == before
    assert len(decodes) == 2
    assert not [f for f in store_files(tmp_path / "store") if fileio.is_temp(f)]
    assert server.agents[-1] == USER_AGENT


def test_identical_bytes_from_two_uris_share_one_blob(tmp_path, server, decodes):
    store = make_store(tmp_path)
    a = store.load(server.url + "/good.png")
    b = store.load(server.url + "/copy.png")  # fetched (new uri) but not decoded again
    assert a.content_id == b.content_id and not b.cached
    assert len(decodes) == 1
    assert len(fileio.list_files(str(tmp_path / "blobs"))) == 1
    assert len(fileio.list_files(str(tmp_path / "info"))) == 1
    assert len(fileio.list_files(str(tmp_path / "uris"))) == 2
    assert store.lookup(server.url + "/copy.png")["content_id"] == a.content_id


def test_concurrent_loads_of_one_uri_are_idempotent(tmp_path, server):
    """Two workers (own store objects, one root) fetch the same image at once and both write."""
    barrier = threading.Barrier(2, timeout=10)

    class InLockstep(HttpFetcher):
        def fetch(self, uri, max_bytes):
            got = super().fetch(uri, max_bytes)
            barrier.wait()  # both have fetched before either writes anything
            return got

    results, errors = [], []

    def work():
        try:
            results.append(
                ImageStore(str(tmp_path), max_bytes=LIMIT, fetcher=InLockstep(allow_private=True)).load(
                    server.url + "/good.jpg"
                )
            )
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert [r.cached for r in results] == [False, False]
    assert results[0].to_record() == results[1].to_record()
    files = store_files(tmp_path)
    assert len(files) == 3 and not [f for f in files if fileio.is_temp(f)]  # blob, info, uri record
    cid = results[0].content_id
    assert ImageStore(str(tmp_path)).get_bytes(cid) == GOOD_JPG


def test_a_damaged_blob_is_fetched_again_from_its_source(tmp_path, server):
    """A blob whose bytes no longer match its name (issue #46) is not decoded as if it were the
    image: it is fetched again from the source its info record names and rewritten; when that
    cannot be done, the error names the damaged blob, not the (intact) source."""
    from pathlib import Path

    from pipelines.image_store import DamagedBlobError

    uri = server.url + "/good.png"
    cid = make_store(tmp_path).load(uri).content_id
    blob = Path(make_store(tmp_path).blob_uri(cid))

    def damage() -> None:
        body = bytearray(blob.read_bytes())
        body[len(body) // 2] ^= 0x01
        blob.write_bytes(bytes(body))

    damage()
    hits = server.hits["/good.png"]
    again = make_store(tmp_path).load(uri)  # a rebuild: the records say it is stored
    assert again.cached and again.read_bytes() == GOOD_PNG  # the image, not the damaged bytes
    assert server.hits["/good.png"] == hits + 1 and blob.read_bytes() == GOOD_PNG  # rewritten
    assert make_store(tmp_path).get_bytes(cid) == GOOD_PNG and server.hits["/good.png"] == hits + 1

    damage()  # and an info record from before sources were recorded: nothing to fetch from
    info_path = Path(make_store(tmp_path).info_uri(cid))
    info = json.loads(info_path.read_text())
    del info["source"]
    info_path.write_text(json.dumps(info))
    with pytest.raises(DamagedBlobError, match=f"blob {blob} is damaged") as err:
        make_store(tmp_path).get_bytes(cid)
    assert uri not in str(err.value)


# ---------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    "path, reason, detail",
    [
        ("/still.gif", "gif", "GIF"),
        ("/anim.png", "animated", ""),
        ("/gone", "placeholder", "/removed.png"),
        ("/missing", "not_found", "HTTP 404"),
        ("/deleted", "not_found", "HTTP 410"),
        ("/forbidden", "fetch_failed", "HTTP 403"),
        ("/big", "too_large", "Content-Length"),
        ("/big-stream", "too_large", f"more than {LIMIT} bytes"),
        ("/page.html", "undecodable", ""),
        ("/flat.png", "blank", "degenerate phash"),
        ("/tiny.png", "too_small", "8x8"),
    ],
)
def test_rejections_have_reasons_and_are_remembered(tmp_path, server, decodes, path, reason, detail):
    store = make_store(tmp_path)
    with pytest.raises(InvalidImage) as err:
        store.load(server.url + path)
    assert err.value.reason == reason and detail in err.value.detail
    assert err.value.cached is False
    n_hits, n_decodes = sum(server.hits.values()), len(decodes)
    with pytest.raises(InvalidImage) as again:
        make_store(tmp_path).load(server.url + path)  # the rebuild
    assert (again.value.reason, again.value.detail, again.value.cached) == (reason, err.value.detail, True)
    assert sum(server.hits.values()) == n_hits and len(decodes) == n_decodes
    if reason in ("gif", "placeholder", "not_found", "fetch_failed", "too_large", "undecodable", "animated"):
        assert not fileio.list_files(str(tmp_path / "blobs"))  # nothing usable stored


@pytest.mark.parametrize("path, detail", [("/error", "HTTP 500"), ("/slow", "timeout")])
def test_transient_failures_are_retried_by_the_next_build(tmp_path, server, path, detail):
    store = make_store(tmp_path)
    for attempt in (1, 2):
        before = server.hits[path]
        with pytest.raises(FetchFailed) as err:
            store.load(server.url + path)
        assert err.value.reason == "fetch_failed" and err.value.transient and detail in err.value.detail
        assert server.hits[path] == before + 1, f"attempt {attempt} did not reach the server"
    assert store.lookup(server.url + path) is None


def test_placeholders_by_phash_from_a_folder(tmp_path, server, decodes):
    examples = tmp_path / "placeholders"
    examples.mkdir()
    (examples / "imgur-removed.png").write_bytes(encode(PLACEHOLDER, "PNG"))
    placeholders = Placeholders.from_dir(str(examples), max_distance=4)
    assert len(placeholders.phashes) == 1 and len(placeholders.sha256s) == 1

    uri = server.url + "/placeholder.jpg"  # a JPEG re-encoding: other bytes, (nearly) same phash
    store = make_store(tmp_path / "store", placeholders=placeholders)
    with pytest.raises(InvalidImage) as err:
        store.load(uri)
    assert err.value.reason == "placeholder" and "phash" in err.value.detail
    assert store.load(server.url + "/good.png").width == 64  # other images pass
    hits, n = sum(server.hits.values()), len(decodes)
    with pytest.raises(InvalidImage, match="placeholder"):
        make_store(tmp_path / "store", placeholders=placeholders).load(uri)
    # The placeholder set is policy, applied to stored facts: without it the image is accepted,
    # still without fetching or decoding anything.
    assert make_store(tmp_path / "store").load(uri).cached
    assert sum(server.hits.values()) == hits and len(decodes) == n


def test_placeholders_by_sha256_and_a_bad_example_folder(tmp_path):
    (tmp_path / "img.png").write_bytes(GOOD_PNG)
    sha = hashlib.sha256(GOOD_PNG).hexdigest()
    store = ImageStore(str(tmp_path / "store"), placeholders=Placeholders({sha}, set()))
    with pytest.raises(InvalidImage) as err:
        store.load(str(tmp_path / "img.png"))
    assert err.value.reason == "placeholder" and "sha256" in err.value.detail
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.png").write_text("not an image")
    with pytest.raises(Exception, match="not a usable image"):
        Placeholders.from_dir(str(bad))


# ---------------------------------------------------------------- local files, object stores


def test_local_paths_and_file_uris(tmp_path, decodes):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.png").write_bytes(GOOD_PNG)
    (src / "big.png").write_bytes(b"\0" * 30_000)
    store = ImageStore(str(tmp_path / "store"), max_bytes=20_000)
    plain = store.load(str(src / "a.png"))
    via_uri = store.load(f"file://{src / 'a.png'}")
    assert plain.content_id == via_uri.content_id and not via_uri.cached and len(decodes) == 1
    assert store.load(str(src / "a.png")).cached

    with pytest.raises(InvalidImage, match="too_large"):
        store.load(str(src / "big.png"))
    missing = str(src / "missing.png")
    for _ in range(2):  # a missing file is looked at again next time (it may be added)
        with pytest.raises(FetchFailed) as err:
            store.load(missing)
        assert err.value.reason == "fetch_failed" and err.value.transient and not err.value.cached
    (src / "missing.png").write_bytes(GOOD_JPG)
    assert store.load(missing).content_id == hashlib.sha256(GOOD_JPG).hexdigest()
    assert isinstance(default_fetcher(missing), FileSystemFetcher)
    assert isinstance(default_fetcher("https://i.imgur.com/x.jpg"), HttpFetcher)


def test_a_local_file_rewritten_in_place_is_read_again(tmp_path, decodes):
    """Local corpora get regenerated into the same folder: the store must not serve old bytes."""
    import os

    path = tmp_path / "img.png"
    path.write_bytes(GOOD_PNG)
    store = ImageStore(str(tmp_path / "store"))
    first = store.load(str(path))
    assert store.load(str(path)).cached and len(decodes) == 1
    path.write_bytes(GOOD_JPG)
    os.utime(path, (time.time() + 5, time.time() + 5))  # a new mtime even on coarse clocks
    again = store.load(str(path))
    assert not again.cached and again.content_id != first.content_id
    assert again.content_id == hashlib.sha256(GOOD_JPG).hexdigest() and len(decodes) == 2


@pytest.fixture
def fake_s3(monkeypatch):
    """Beam's S3 filesystem over Beam's own in-memory fake S3 client (no boto3, no network)."""
    from apache_beam.io.aws import s3io
    from apache_beam.io.aws.clients.s3.fake_client import FakeS3Client

    fake = FakeS3Client()

    def init(self, client=None, options=None):
        self.client = client or fake

    monkeypatch.setattr(s3io.S3IO, "__init__", init)
    return fake


def test_store_on_an_object_store(tmp_path, fake_s3, decodes):
    (tmp_path / "a.png").write_bytes(GOOD_PNG)
    store = ImageStore("s3://bucket/images")
    img = store.load(str(tmp_path / "a.png"))
    assert fileio.exists(f"s3://bucket/images/blobs/{img.content_id[:2]}/{img.content_id}")
    again = pickle.loads(pickle.dumps(store)).load(str(tmp_path / "a.png"))
    assert again.cached and again.read_bytes() == GOOD_PNG and len(decodes) == 1
    assert len(fileio.list_files("s3://bucket/images")) == 3


def test_store_and_fetchers_pickle(tmp_path, server):
    store = make_store(tmp_path)
    store.load(server.url + "/good.png")  # creates the HTTP session
    clone = pickle.loads(pickle.dumps(store))
    assert clone.root == store.root and clone.fetcher._session is None
    assert clone.load(server.url + "/good.png").cached


# ---------------------------------------------------------------- fileio


def test_fileio_local(tmp_path):
    target = str(tmp_path / "a" / "b" / "x.json")
    fileio.write_bytes_atomic(target, b'{"k": 1}')  # parents are created
    assert fileio.read_text(target) == '{"k": 1}'
    fileio.write_bytes_atomic(target, b"v2")  # replaces
    assert fileio.read_bytes(target) == b"v2" and fileio.exists(target)
    with pytest.raises(fileio.FileTooLarge, match="larger than 1 bytes"):
        fileio.read_bytes(target, limit=1)
    assert fileio.read_bytes(target, limit=2) == b"v2"
    with pytest.raises(FileNotFoundError):
        fileio.read_bytes(str(tmp_path / "nope"))

    fileio.write_bytes_atomic(str(tmp_path / "a" / "y.bin"), b"y")
    assert fileio.list_files(str(tmp_path / "a")) == [
        str(tmp_path / "a" / "b" / "x.json"),
        str(tmp_path / "a" / "y.bin"),
    ]
    assert fileio.list_files(str(tmp_path / "a" / "*.bin")) == [str(tmp_path / "a" / "y.bin")]
    assert fileio.list_files(f"file://{tmp_path}/a/**.json") == [target]
    assert fileio.list_files(str(tmp_path / "missing")) == []

    fileio.rename(str(tmp_path / "a" / "y.bin"), str(tmp_path / "c" / "z.bin"))
    assert fileio.read_bytes(str(tmp_path / "c" / "z.bin")) == b"y"
    fileio.rename(str(tmp_path / "c"), str(tmp_path / "d"))  # local directories move whole
    assert fileio.exists(str(tmp_path / "d" / "z.bin")) and not fileio.exists(str(tmp_path / "c"))

    fileio.delete_tree(str(tmp_path / "a"))
    fileio.delete_tree(str(tmp_path / "a"))  # missing: fine
    fileio.delete_tree(str(tmp_path / "d" / "z.bin"))
    assert fileio.list_files(str(tmp_path)) == []
    fileio.mkdirs(str(tmp_path / "m" / "n"))
    fileio.mkdirs(str(tmp_path / "m" / "n"))
    assert (tmp_path / "m" / "n").is_dir()
    assert fileio.join("gs://b/x/", "y", "z.png") == "gs://b/x/y/z.png"  # no GCS client needed
    assert fileio.join(str(tmp_path), "q") == str(tmp_path / "q")
    assert fileio.normalize("file:///tmp/a%20b") == "/tmp/a b"


def test_open_write_streams_parquet_and_commits_only_on_success(tmp_path):
    path = str(tmp_path / "shards" / "train-00000.parquet")
    table = pa.table({"doc_id": ["a", "b"], "n": [1, 2]})
    with fileio.open_write(path) as fh:
        pq.write_table(table, fh, compression="zstd")
    assert pq.read_table(path).equals(table)

    with pytest.raises(RuntimeError, match="boom"):
        with fileio.open_write(path) as fh:
            fh.write(b"half a shard")
            raise RuntimeError("boom")
    assert pq.read_table(path).equals(table)  # the old file is intact
    assert fileio.list_files(str(tmp_path), include_temp=True) == [path]  # the temp file is gone


def test_fileio_on_an_object_store(fake_s3):
    fileio.mkdirs("s3://bkt/out/shards")  # no-op
    with fileio.open_write("s3://bkt/out/shards/a.parquet") as fh:
        pq.write_table(pa.table({"x": [1]}), fh)
    fileio.write_bytes_atomic("s3://bkt/out/manifest.json", json.dumps({"v": 1}).encode())
    fileio.write_bytes_atomic("s3://bkt/outer/keep.txt", b"k")
    assert fileio.list_files("s3://bkt/out") == [
        "s3://bkt/out/manifest.json",
        "s3://bkt/out/shards/a.parquet",
    ]
    assert fileio.list_files("s3://bkt/out/shards/*.parquet") == ["s3://bkt/out/shards/a.parquet"]
    assert pq.read_table(io.BytesIO(fileio.read_bytes("s3://bkt/out/shards/a.parquet"))).num_rows == 1

    with pytest.raises(ValueError):
        with fileio.open_write("s3://bkt/out/broken.bin") as fh:
            fh.write(b"x")
            raise ValueError("no")
    assert not fileio.exists("s3://bkt/out/broken.bin")
    assert not [f for f in fileio.list_files("s3://bkt", include_temp=True) if fileio.is_temp(f)]

    fileio.rename("s3://bkt/out/shards", "s3://bkt/final/shards")  # a prefix moves file by file
    assert fileio.list_files("s3://bkt/final") == ["s3://bkt/final/shards/a.parquet"]
    fileio.delete_tree("s3://bkt/out")
    fileio.delete_tree("s3://bkt/never")
    assert fileio.list_files("s3://bkt") == ["s3://bkt/final/shards/a.parquet", "s3://bkt/outer/keep.txt"]
    with pytest.raises(FileNotFoundError):
        fileio.read_bytes("s3://bkt/out/manifest.json")
