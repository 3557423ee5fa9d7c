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
