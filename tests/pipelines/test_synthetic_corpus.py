import hashlib
import json

from pipelines.synthetic_corpus import COLOURS, SynthConfig, generate_document, write_corpus


def _digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_corpus_is_reproducible_from_the_seed(tmp_path):
    cfg = SynthConfig(docs=6, seed=11, image_size=48)
    write_corpus(tmp_path / "a", cfg)
    write_corpus(tmp_path / "b", cfg)
    write_corpus(tmp_path / "c", SynthConfig(docs=6, seed=12, image_size=48))
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_links_are_valid_and_distractors_exist(tmp_path):
    cfg = SynthConfig(docs=40, seed=1, image_size=48, extra_sentence_rate=0.5, extra_image_rate=0.5)
    path = write_corpus(tmp_path, cfg)
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(docs) == 40 and len({d["doc_id"] for d in docs}) == 40
    unlinked_sent = unlinked_img = 0
    for d in docs:
        n, m = len(d["sentences"]), len(d["images"])
        linked_s = {s for s, _ in d["links"]}
        linked_i = {i for _, i in d["links"]}
        assert all(0 <= s < n and 0 <= i < m for s, i in d["links"])
        assert len(linked_s) == len(linked_i) == len(d["links"])  # one-to-one, like the paper's docs
        assert cfg.images_min <= len(linked_i) <= cfg.images_max
        unlinked_sent += n - len(linked_s)
        unlinked_img += m - len(linked_i)
        assert all((tmp_path / p).exists() for p in d["images"])
    assert unlinked_sent > 0 and unlinked_img > 0


def test_linked_sentence_names_its_images_colour_and_shape():
    cfg = SynthConfig(docs=1, seed=5, extra_sentence_rate=0.0, extra_image_rate=0.0)
    record, images = generate_document(cfg, 0)
    for s, i in record["links"]:
        text = record["sentences"][s]
        assert any(c in text for c in COLOURS)
        assert images[i].size == (cfg.image_size, cfg.image_size)


def test_palette_similarity_limits_colours_per_document():
    cfg = SynthConfig(docs=20, seed=2, palette_similarity=1.0, extra_sentence_rate=0.0)
    for i in range(20):
        record, _ = generate_document(cfg, i)
        named = {c for s in record["sentences"] for c in COLOURS if f" {c} " in f" {s} "}
        assert len(named) <= 2
        assert record["metadata"]["palette"] == "shared"


def test_the_topic_confound_puts_the_documents_project_in_every_sentence():
    cfg = SynthConfig(docs=8, seed=4, image_size=48, topic_words=3, extra_sentence_rate=1.0)
    topics = set()
    for i in range(cfg.docs):
        record, _ = generate_document(cfg, i)
        words = record["metadata"]["topic"].split()
        assert len(words) == 3 and all(all(w in s.split() for w in words) for s in record["sentences"])
        topics.add(record["metadata"]["topic"])
    assert len(topics) > 1  # documents differ in topic
    plain, _ = generate_document(SynthConfig(docs=8, seed=4, image_size=48, extra_sentence_rate=1.0), 0)
    assert "topic" not in plain["metadata"]
    assert [s for s in plain["sentences"]] != generate_document(cfg, 0)[0]["sentences"]


def test_the_style_confound_makes_a_documents_images_alike():
    """Mean colours of images in one document sit closer together than across documents when
    the style is on, and the corpus without it is what it was (style draws its own stream)."""
    import numpy as np

    def mean_colours(cfg, i):
        return np.array(
            [np.asarray(im, dtype=float).mean(axis=(0, 1)) for im in generate_document(cfg, i)[1]]
        )

    def within_vs_across(cfg):
        docs = [mean_colours(cfg, i) for i in range(10)]
        within = np.mean([np.linalg.norm(d - d.mean(0), axis=1).mean() for d in docs])
        centre = np.concatenate(docs).mean(0)
        across = np.mean([np.linalg.norm(d.mean(0) - centre) for d in docs])
        return within / across

    styled = SynthConfig(seed=2, image_size=48, style_strength=1.0)
    plain = SynthConfig(seed=2, image_size=48)
    assert within_vs_across(styled) < 0.6 * within_vs_across(plain)
    before, _ = generate_document(plain, 1)
    again, _ = generate_document(SynthConfig(seed=2, image_size=48, style_strength=0.0), 1)
    assert before == again


def test_a_bad_line_is_dead_lettered_with_its_file_and_line_number(tmp_path):
    """Beam reads the file in byte ranges without line numbers; the dead letter still says where
    the line is (issue #46: it named neither the file nor the line)."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.direct_runner import DirectRunner
    from pipelines.records import DEAD_LETTER
    from pipelines.sources.synthetic import ReadSyntheticCorpus

    good = {"doc_id": "d1", "sentences": ["a"], "images": ["a.png"]}
    lines = [json.dumps(good), "{oops", json.dumps({**good, "doc_id": "d2"}), '{"doc_id": "x"}']
    (tmp_path / "documents.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    path = str(tmp_path / "documents.jsonl")
    with TestPipeline(runner=DirectRunner()) as p:
        out = p | ReadSyntheticCorpus(str(tmp_path))
        dead = out[DEAD_LETTER] | beam.Map(lambda d: (d.source_id, d.reason, "the line starts" in d.detail))
        want = [(f"{path}:2", "malformed_record", True), (f"{path}:4", "malformed_record", True)]
        assert_that(dead, equal_to([*want, (f"{path}:5", "not_utf8", True)]))
