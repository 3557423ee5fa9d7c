"""The Clue source on fixtures in the released CSV format (tests/fixtures/clue/)."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from pipelines.direct_runner import DirectRunner
from pipelines.records import DEAD_LETTER, RawDocument
from pipelines.sources import get_spec
from pipelines.sources.clue import RELATIONS, ReadClue, hosts_of, parse_clue_csv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clue"


def test_rows_become_pairs_with_relations_and_bad_rows_dead_letters():
    out = list(parse_clue_csv((FIXTURES / "train.csv").read_text(), str(FIXTURES / "train.csv")))
    docs = [d for d in out if isinstance(d, RawDocument)]
    dead = [d for d in out if not isinstance(d, RawDocument)]
    assert [d.doc_id for d in docs] == ["clue-train-12", "clue-train-57", "clue-train-90"]
    horse = docs[0]
    assert horse.sentences == ["young horse grazing in the forest"] and horse.links == [(0, 0)]
    assert horse.image_uris == ["https://img.example-cdn.org/photos/12.jpg"] and horse.split is None
    assert horse.metadata["relations"] == "Visible,Action"
    assert docs[1].metadata["relations"] == "Story" and docs[1].metadata["clue_when"] == "1"
    assert docs[2].metadata["clue_comment"] == "lovely"
    assert [(sid, reason) for sid, reason, _ in dead] == [
        ("train:113", "no_caption"),
        ("train:150", "bad_url"),
        ("train:171", "bad_label"),
    ]
    (test_doc,) = parse_clue_csv((FIXTURES / "test.csv").read_text(), "test.csv")
    assert test_doc.split == "test" and test_doc.metadata["relations"] == "Visible,Meta"


def test_a_file_without_the_columns_is_refused_as_a_whole():
    assert list(parse_clue_csv("caption,url\na,http://x/y.jpg\n", "odd.csv")) == [
        (
            "odd.csv",
            "bad_header",
            "missing columns ['index', 'Visible', 'Subjective', 'Action', 'Story', "
            "'Meta', 'Irrelevant', 'Other', 'When', 'How', 'Where', 'Comment']",
        )
    ]


def test_spec_vocabulary_hosts_and_beam_transform(tmp_path):
    spec = get_spec("clue")
    ctx = spec.context(str(FIXTURES), {}, str(tmp_path / "state"))
    spec.check(ctx)
    assert spec.relations(ctx) == list(RELATIONS)
    assert hosts_of(str(FIXTURES)) == {"img.example-cdn.org", "media.example.net"}
    with beam.Pipeline(runner=DirectRunner()) as p:
        out = p | ReadClue(str(FIXTURES))
        assert_that(
            out.documents | beam.Map(lambda d: d.doc_id),
            equal_to(["clue-train-12", "clue-train-57", "clue-train-90", "clue-test-7"]),
            label="docs",
        )
        assert_that(
            out[DEAD_LETTER] | beam.Map(lambda d: d.reason),
            equal_to(["no_caption", "bad_url", "bad_label"]),
            label="dead",
        )


class _Images:
    """A loopback server for the fixture's image URLs: /photos/<n>.jpg -> a JPEG, else 404."""

    def __enter__(self):
        import http.server
        import threading

        from tests.fixtures.images import noise_jpeg

        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                name = self.path.rsplit("/", 1)[-1]
                if not name.endswith((".jpg", ".jpeg")):
                    self.send_response(404)
                    self.end_headers()
                    return
                body = noise_jpeg(int(name.split(".")[0]), 128)
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _local_copy(tmp_path: Path, base: str) -> Path:
    """The fixture with its image hosts pointed at the loopback server."""
    out = tmp_path / "clue"
    out.mkdir()
    for name in ("train.csv", "test.csv"):
        text = (FIXTURES / name).read_text()
        for host in ("https://img.example-cdn.org", "http://media.example.net"):
            text = text.replace(host, base)
        (out / name).write_text(text)
    return out


def test_fetcher_gets_images_from_the_csv_hosts_only(tmp_path):
    from pipelines.image_fetch import FetchFailed

    spec = get_spec("clue")
    with _Images() as images:
        folder = _local_copy(tmp_path, images.base)
        options = {"allow_private": "true", "polite": "false", "retries": "0"}
        fetcher = spec.fetcher(spec.context(str(folder), options, str(tmp_path / "state")))
        assert fetcher.fetch(f"{images.base}/photos/12.jpg", 10_000_000).data[:2] == b"\xff\xd8"
        with pytest.raises(FetchFailed, match="refused_host"):
            fetcher.fetch("http://localhost:1/photos/12.jpg", 10_000_000)


@pytest.mark.slow
def test_clue_builds_a_pair_dataset(tmp_path):
    """Beam build from the CSVs over loopback: pairs with relations, the vocabulary in the
    manifest, the test file as the test split, a dead link as a dead letter."""
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from schemas.shards import read_table

    with _Images() as images:
        folder = _local_copy(tmp_path, images.base)
        (folder / "train.csv").write_text(
            (folder / "train.csv").read_text()
            + f"6,200,a dead link,{images.base}/photos/gone.png,1,0,0,0,0,0,0,,,,\n"
        )
        options = {"allow_private": "true", "polite": "false", "retries": "0"}
        manifest = build_dataset(
            BuildConfig.for_source("clue", str(folder), str(tmp_path / "ds"), source_options=options)
        )
    assert manifest.relations == list(RELATIONS)
    assert manifest.counts["splits"]["test"] == 1
    assert sum(manifest.counts["splits"].values()) == 4, manifest.counts["dropped"]
    table = read_table([str(p) for p in manifest.shard_paths(tmp_path / "ds")], ["doc_id", "metadata"])
    rels = {
        d: dict(m)["relations"]
        for d, m in zip(table.column("doc_id").to_pylist(), table.column("metadata").to_pylist(), strict=True)
    }
    assert rels["clue-train-12"] == "Visible,Action" and rels["clue-test-7"] == "Visible,Meta"
    assert manifest.counts["dropped"]["image:not_found"] == 1  # the dead link


def test_odd_urls_and_a_lone_carriage_return_are_dead_letters_not_crashes(tmp_path):
    """Found by tests/faults/test_table_fuzz.py: an unclosed IPv6 bracket (urlsplit's ValueError)
    and a lone \\r in an unquoted field (csv.Error) crashed the parse step and, on the driver,
    the allowlist (hosts_of) before the build started."""
    from pipelines.sources.clue import COLUMNS, ParseClueFile

    path = tmp_path / "train.csv"
    path.write_text(
        ",".join(COLUMNS) + "\n"
        "0,1,cap,http://[x/a.jpg,1,0,0,0,0,0,,,,,\n"
        "1,2,cap,http://a\uff03b/a.jpg,1,0,0,0,0,0,,,,,\n"
        "2,3,a\rb,https://ok.example.org/a.jpg,1,0,0,0,0,0,,,,,\n"
        "3,4,fine,https://ok.example.org/b.jpg,0,1,0,0,0,0,,,,,\n",
        newline="",
    )
    out = list(ParseClueFile().process(str(path)))
    dead = [o.value for o in out if getattr(o, "tag", None) == DEAD_LETTER]
    assert [(d.source_id, d.reason) for d in dead][:2] == [("train:1", "bad_url"), ("train:2", "bad_url")]
    # the \r is a line break to csv: the two halves of that row are bad rows, the next is kept
    assert len(dead) == 4 and [d.doc_id for d in out if isinstance(d, RawDocument)] == ["clue-train-4"]
    assert hosts_of(str(path)) == {"ok.example.org"}
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe")  # not UTF-8: skipped here, dead-lettered by the step
    assert hosts_of(str(tmp_path)) == {"ok.example.org"}
