"""Wikipedia articles as documents: the ImageCLEF Wikipedia collection, or the live MediaWiki API.

Paper (Hessel et al. 2019, supplement "WIKI"): the English part of the ImageCLEF 2011 Wikipedia
retrieval collection (the "ImageCLEF 2010 Wikipedia collection", 237,434 images from 44,664
articles); wiki formatting stripped, sentence split (spaCy there, ``pysbd`` here: see
``pipelines.text_segmentation``), first 100 sentences kept, documents with < 10 sentences or
< 3 images dropped. No ground-truth links. The 100-sentence cut and the size filters are the
shared ``wiki`` filter preset of the build, not this connector's job: a document here carries all
its sentences (up to a hard 1000, to bound memory) so the filter's counts stay right.

**mode=imageclef** (``--input`` = the collection root). Layout, as read by published indexers of
the collection: ``all_text/metadata/<dir>/<id>.xml``, one file per image::

    <image id="1" file="images/1/1.jpg">
      <name>Foo.jpg</name>
      <text xml:lang="en">
        <description>...</description> <comment>...</comment>
        <caption article="text/en/1/249161">...</caption>
      </text>
      <text xml:lang="de">...</text> <text xml:lang="fr">...</text>
      <comment>...</comment> <license>...</license>
    </image>

``metadata/`` directly under the root works too. The ``article`` attribute names the article
file (a path whose last part is the article id) relative to ``all_text/`` or the root, with or
without an extension; the file is raw wikitext or wikitext wrapped in XML (``<article>`` /
``<page>`` with ``<title>``/``<name>`` and ``<text>``/``<body>``): both are accepted, since the
exact article format could not be verified. Images are ``<root>/<file attribute>``.

**mode=mediawiki** (``--input`` = a text file of article titles, one per line, ``#`` comments):
``action=parse`` for each article's HTML and image list, ``action=query&prop=imageinfo`` for the
image URLs (<= 50 titles a call), through the shared polite HTTP client, one request at a time.
Finished articles are recorded in the crawl state, so a rerun fetches only what is missing.

Modules: ``common`` (shared constants), ``imageclef``, ``mediawiki`` (one per mode), ``spec``
(the SourceSpec). This package re-exports their public names and ``SPEC``.
"""

from __future__ import annotations

from pipelines.sources.wiki.common import HARD_MAX_SENTENCES, MODES, SOURCE
from pipelines.sources.wiki.imageclef import (
    BuildImageClefDocument,
    ImageMetadata,
    ParseImageMetadata,
    ReadImageClef,
    article_id,
    imageclef_doc_id,
    imageclef_layout,
    parse_image_metadata,
    unwrap_article,
)
from pipelines.sources.wiki.mediawiki import (
    ArticleFailed,
    MediaWikiArticles,
    ReadMediaWiki,
    file_names_in_html,
    normalize_title,
    parse_titles_line,
)
from pipelines.sources.wiki.spec import SPEC

__all__ = [
    "HARD_MAX_SENTENCES",
    "MODES",
    "SOURCE",
    "SPEC",
    "ArticleFailed",
    "BuildImageClefDocument",
    "ImageMetadata",
    "MediaWikiArticles",
    "ParseImageMetadata",
    "ReadImageClef",
    "ReadMediaWiki",
    "article_id",
    "file_names_in_html",
    "imageclef_doc_id",
    "imageclef_layout",
    "normalize_title",
    "parse_image_metadata",
    "parse_titles_line",
    "unwrap_article",
]
