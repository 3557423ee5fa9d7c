"""mode=imageclef: the ImageCLEF Wikipedia collection (per-image metadata XML + article files)
-> one document per article and language; see the package docstring for the layout.
"""

from __future__ import annotations

import posixpath
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.io import fileio as beam_fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines import fileio
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.wiki.common import HARD_MAX_SENTENCES, SOURCE
from pipelines.text_segmentation import split_sentences, strip_wiki_markup

MAX_ARTICLE_BYTES = 64 * 1024 * 1024
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_ARTICLE_SUFFIXES = ("", ".xml", ".txt", ".wiki", ".wikitext")
_WRAPPER_TAGS = frozenset({"article", "page", "doc", "document", "mediawiki"})


# --- mode=imageclef ---------------------------------------------------------------------


@dataclass
class ImageMetadata:
    """One ``metadata/<dir>/<id>.xml`` file: the image and the articles that show it."""

    image_id: str
    file: str  # image path relative to the collection root
    name: str = ""
    # (lang, article path, caption) for every caption with an ``article`` in a wanted language
    captions: list[tuple[str, str, str]] = field(default_factory=list)


def _lang_of(el: ET.Element) -> str:
    return (el.get(_XML_LANG) or el.get("lang") or "").strip().lower()


def _text_of(el: ET.Element | None) -> str:
    return " ".join("".join(el.itertext()).split()) if el is not None else ""


def parse_image_metadata(data: bytes, path: str, langs: Iterable[str]) -> ImageMetadata:
    """Parse one image metadata file; ``ValueError`` when it is malformed."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:  # a SyntaxError subclass: callers catch ValueError
        raise ValueError(f"not well-formed XML: {exc}") from exc
    if root.tag != "image":
        raise ValueError(f"root element is <{root.tag}>, not <image>")
    stem = posixpath.splitext(posixpath.basename(path))[0]
    image_id = (root.get("id") or stem).strip()
    if not image_id:
        raise ValueError("image without an id")
    folder = posixpath.basename(posixpath.dirname(path))
    file = (root.get("file") or f"images/{folder}/{image_id}.jpg").strip().lstrip("/")
    wanted = {lang.lower() for lang in langs}
    captions = []
    for text in root.findall("text"):
        lang = _lang_of(text)
        if lang not in wanted:
            continue
        for cap in text.findall("caption"):
            article = (cap.get("article") or "").strip().strip("/")
            if article:
                captions.append((lang, article, _text_of(cap)))
    return ImageMetadata(image_id, file, _text_of(root.find("name")), captions)


def article_id(article: str) -> str:
    """``text/en/1/249161`` -> ``249161`` (the last path part, without an extension)."""
    base = posixpath.basename(article.strip("/"))
    stem, ext = posixpath.splitext(base)
    return stem if ext.lower() in _ARTICLE_SUFFIXES and stem else base


def imageclef_doc_id(lang: str, article: str) -> str:
    aid = article_id(article)
    return f"wiki-{aid}" if lang == "en" else f"wiki-{lang}-{aid}"


def unwrap_article(text: str) -> tuple[str, str]:
    """(title, wikitext) of an article file: raw wikitext, or wikitext wrapped in XML.

    Raises ``ValueError`` for a file that declares itself XML but does not parse.
    """
    head = text.lstrip("\ufeff \t\r\n")
    match = re.match(r"<\?xml[^>]*\?>\s*|<([A-Za-z][\w:-]*)", head)
    if not match:
        return "", text
    tag = (match.group(1) or "").lower()
    if match.group(0).startswith("<?xml"):
        tag = ""
    elif tag not in _WRAPPER_TAGS:
        return "", text  # wikitext that starts with an HTML tag (<div>, <!-- -->...)
    # Python refuses an encoding declaration in a str: the bytes were decoded already.
    try:
        root = ET.fromstring(re.sub(r"^<\?xml[^>]*\?>", "", head, count=1))
    except ET.ParseError as exc:
        raise ValueError(f"not well-formed XML: {exc}") from exc
    title_el = next((el for el in (root.find(".//title"), root.find(".//name")) if el is not None), None)
    title = _text_of(title_el) or (root.get("title") or root.get("name") or "").strip()
    for name in ("text", "body", "content"):
        el = root.find(f".//{name}")
        if el is not None:
            return title, "".join(el.itertext())
    # No text element: the root's text, less the title, is the article.
    if title_el is not None:
        tail = title_el.tail
        title_el.clear()  # clear() also drops the tail, which is article text
        title_el.tail = tail
    return title, "".join(root.itertext())


def _sort_key(image_id: str) -> tuple[int, int, str]:
    return (0, int(image_id), "") if image_id.isdigit() else (1, 0, image_id)


class ParseImageMetadata(beam.DoFn):
    """Metadata file -> ((lang, article), image record) for each article showing the image."""

    def __init__(self, root: str, langs: tuple[str, ...]):
        self.root = root
        self.langs = langs

    def process(self, readable: beam_fileio.ReadableFile) -> Iterator:
        path = readable.metadata.path
        count("metadata_files_in")
        try:
            meta = parse_image_metadata(readable.read(), path, self.langs)
        except ValueError as exc:
            yield dead_letter("line", path, "malformed_xml", f"{type(exc).__name__}: {exc}")
            return
        if not meta.captions:
            count("images_without_article")
            return
        uri = fileio.join(self.root, meta.file)
        for lang, article in dict.fromkeys((lang, article) for lang, article, _ in meta.captions):
            count("image_article_pairs")
            yield (lang, article), {"id": meta.image_id, "uri": uri}


class BuildImageClefDocument(beam.DoFn):
    """(lang, article), images -> RawDocument from the article file."""

    def __init__(self, article_roots: tuple[str, ...]):
        self.article_roots = article_roots

    def _find_article(self, article: str) -> str | None:
        for root in self.article_roots:
            for suffix in _ARTICLE_SUFFIXES:
                uri = fileio.join(root, article + suffix)
                if FileSystems.exists(uri):
                    return uri
        return None

    def process(self, element) -> Iterator:
        (lang, article), images = element
        doc_id = imageclef_doc_id(lang, article)
        uri = self._find_article(article)
        if uri is None:
            yield dead_letter("document", doc_id, "missing_article", article)
            return
        try:
            data = fileio.read_bytes(uri, limit=MAX_ARTICLE_BYTES)
        except fileio.FileTooLarge as exc:
            yield dead_letter("document", doc_id, "article_too_large", str(exc))
            return
        except OSError as exc:
            yield dead_letter("document", doc_id, "unreadable_article", f"{uri}: {exc}")
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            count("article_not_utf8")  # decoded with replacement characters, kept
            text = data.decode("utf-8", "replace")
        try:
            title, wikitext = unwrap_article(text)
        except ValueError as exc:
            yield dead_letter("document", doc_id, "malformed_article", f"{uri}: {exc}")
            return
        sentences = split_sentences(strip_wiki_markup(wikitext), HARD_MAX_SENTENCES + 1)
        if len(sentences) > HARD_MAX_SENTENCES:
            count("articles_sentences_capped")
            sentences = sentences[:HARD_MAX_SENTENCES]
        unique = {img["id"]: img for img in images}
        ordered = [unique[k] for k in sorted(unique, key=_sort_key)]
        count("documents_in")
        yield RawDocument(
            doc_id=doc_id,
            source=SOURCE,
            sentences=sentences,
            image_uris=[img["uri"] for img in ordered],
            links=None,
            metadata={
                "title": title or article_id(article),
                "article": article,
                "article_uri": uri,
                "lang": lang,
                "image_ids": ",".join(img["id"] for img in ordered),
            },
        )


def imageclef_layout(root: str) -> tuple[list[str], tuple[str, ...]]:
    """(metadata glob patterns, folders that article paths are relative to) for a collection root."""
    text_roots = (fileio.join(root, "all_text"), root)
    patterns = [fileio.join(t, "metadata", *p) for t in text_roots for p in (("*", "*.xml"), ("*.xml",))]
    return patterns, text_roots


class ReadImageClef(beam.PTransform):
    """The ImageCLEF Wikipedia collection -> one RawDocument per article (``dead_letter`` too)."""

    def __init__(self, root: str, langs: tuple[str, ...] = ("en",)):
        super().__init__()
        self.root = str(root)
        self.langs = tuple(langs)

    def expand(self, pbegin):
        patterns, text_roots = imageclef_layout(self.root)
        parsed = (
            pbegin
            | "Patterns" >> beam.Create(patterns)
            | "Match" >> beam_fileio.MatchAll(beam_fileio.EmptyMatchTreatment.ALLOW)
            | "Open" >> beam_fileio.ReadMatches(compression=CompressionTypes.UNCOMPRESSED)
            | "ParseMetadata" >> dead_lettered(ParseImageMetadata(self.root, self.langs), "pairs")
        )
        built = (
            parsed.pairs
            | "GroupByArticle" >> beam.GroupByKey()
            | "BuildDocuments" >> dead_lettered(BuildImageClefDocument(text_roots))
        )
        dead = (parsed[DEAD_LETTER], built[DEAD_LETTER]) | "FlattenDead" >> beam.Flatten()
        return {"documents": built.documents, DEAD_LETTER: dead}
