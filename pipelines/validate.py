"""Load a document's images through the image store, drop what is unusable, remap links.

Why item by item: one corrupt file never sinks a post (a document goes only when nothing usable
is left); the store remembers every fetch and decode, so a rebuild repeats none."""

from __future__ import annotations

import apache_beam as beam

from features.images import InvalidImage
from pipelines import fault_hooks
from pipelines.image_fetch import Fetcher
from pipelines.image_store import ImageStore, Placeholders
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter
from schemas.text import has_tokens, repair_text


def keep_sentences_with_tokens(doc_id: str, texts: list[str]):
    """Generator: yields a dead letter per token-less sentence; returns (kept, old -> new index).

    Used with ``yield from`` inside a DoFn, so the drops reach the dead-letter output and the
    index map lets the caller remap ground-truth links.
    """
    sentences, sentence_map = [], {}
    for k, raw in enumerate(texts):
        text, repaired = repair_text(raw)
        if repaired:
            count("text_repaired")
        if not has_tokens(text):
            yield dead_letter("sentence", f"{doc_id}#sentence-{k}", "no_tokens", text[:80])
            continue
        sentence_map[k] = len(sentences)
        sentences.append(text)
    return sentences, sentence_map


class LoadAndValidate(beam.DoFn):
    """RawDocument -> cleaned document dict (images as store records); dead letters on the side."""

    def __init__(
        self, store_root: str, placeholders: Placeholders | None = None, fetcher: Fetcher | None = None
    ):
        self.store_root = store_root
        self.placeholders = placeholders
        self.fetcher = fetcher  # the source's (e.g. a polite HTTP client); None: chosen by URI scheme

    def setup(self):
        from pipelines.worker_tuning import tune_worker_process

        tune_worker_process()
        self.store = ImageStore(self.store_root, placeholders=self.placeholders)

    def process(self, doc: RawDocument):
        fault_hooks.reached("read")
        if not doc.sentences and not doc.image_uris:
            yield dead_letter("document", doc.doc_id, "empty_document")
            return
        count("images_in", len(doc.image_uris))
        count("sentences_in", len(doc.sentences))

        images, image_map = [], {}
        for k, uri in enumerate(doc.image_uris):
            try:
                stored = self.store.load(uri, self.fetcher)
            except InvalidImage as exc:
                yield dead_letter("image", f"{doc.doc_id}#image-{k}", exc.reason, f"{uri}: {exc.detail}")
                continue
            count("images_from_store" if stored.cached else "images_fetched")
            image_map[k] = len(images)
            images.append(stored.to_record())

        sentences, sentence_map = yield from keep_sentences_with_tokens(doc.doc_id, doc.sentences)

        if not images:
            yield dead_letter("document", doc.doc_id, "no_valid_images")
            return
        if not sentences:
            yield dead_letter("document", doc.doc_id, "no_sentences")
            return

        links = None
        if doc.links is not None:
            kept = set()
            for s, i in doc.links:
                if not (0 <= s < len(doc.sentences) and 0 <= i < len(doc.image_uris)):
                    yield dead_letter("link", doc.doc_id, "out_of_range", f"({s}, {i})")
                elif s in sentence_map and i in image_map:
                    kept.add((sentence_map[s], image_map[i]))
                else:
                    yield dead_letter("link", doc.doc_id, "endpoint_dropped", f"({s}, {i})")
            links = sorted(kept)
        metadata = {}
        for key, value in doc.metadata.items():
            (key, k_fixed), (value, v_fixed) = repair_text(key), repair_text(value)
            if k_fixed or v_fixed:
                count("text_repaired")
            metadata[key] = value
        yield {
            "doc_id": doc.doc_id,
            "source": doc.source,
            "split": doc.split,
            "sentences": sentences,
            "images": images,
            "links": links,
            "metadata": metadata,
        }


__all__ = ["DEAD_LETTER", "LoadAndValidate"]
