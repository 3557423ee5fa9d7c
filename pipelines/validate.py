"""Load a document's images, drop what is unusable (counted, dead-lettered), remap links.

A bad image or an empty sentence costs only that item; a document is dropped only when nothing
usable is left (no valid image, no sentence with tokens), so one corrupt file never sinks a post.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines.images import InvalidImage, inspect_image
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter
from schemas.text import has_tokens

IMAGE_BYTES = "image_bytes"
MAX_IMAGE_BYTES = 32 * 1024 * 1024


def read_bytes(uri: str, limit: int = MAX_IMAGE_BYTES) -> bytes:
    with FileSystems.open(uri) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InvalidImage("too_large", f"> {limit} bytes")
    return data


class LoadAndValidate(beam.DoFn):
    """RawDocument -> cleaned document dict; side outputs image bytes and dead letters."""

    def process(self, doc: RawDocument):
        if not doc.sentences and not doc.image_uris:
            yield dead_letter("document", doc.doc_id, "empty_document")
            return
        count("images_in", len(doc.image_uris))
        count("sentences_in", len(doc.sentences))

        images, image_map, blobs = [], {}, []
        for k, uri in enumerate(doc.image_uris):
            try:
                data = read_bytes(uri)
                info, _ = inspect_image(data)
            except InvalidImage as exc:
                yield dead_letter("image", f"{doc.doc_id}#image-{k}", exc.reason, f"{uri}: {exc.detail}")
                continue
            except OSError as exc:  # missing or unreadable file
                yield dead_letter("image", f"{doc.doc_id}#image-{k}", "unreadable", f"{uri}: {exc}")
                continue
            image_map[k] = len(images)
            images.append(
                {
                    "content_id": info.content_id,
                    "uri": uri,
                    "width": info.width,
                    "height": info.height,
                    "phash": info.phash,
                }
            )
            blobs.append((info.content_id, data))

        sentences, sentence_map = [], {}
        for k, text in enumerate(doc.sentences):
            if not has_tokens(text):
                yield dead_letter("sentence", f"{doc.doc_id}#sentence-{k}", "no_tokens", text[:80])
                continue
            sentence_map[k] = len(sentences)
            sentences.append(text)

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
        # Only images of kept documents go on to (costly) feature extraction.
        for blob in blobs:
            yield beam.pvalue.TaggedOutput(IMAGE_BYTES, blob)
        yield {
            "doc_id": doc.doc_id,
            "source": doc.source,
            "split": doc.split,
            "sentences": sentences,
            "images": images,
            "links": links,
            "metadata": doc.metadata,
        }


__all__ = ["DEAD_LETTER", "IMAGE_BYTES", "LoadAndValidate"]
