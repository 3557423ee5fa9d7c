"""Wikipedia articles as documents: the ImageCLEF Wikipedia collection, or the live MediaWiki API.

Paper (Hessel et al. 2019, supplement "WIKI"): the English part of the ImageCLEF 2011 Wikipedia
retrieval collection (237,434 images from 44,664 articles), wiki formatting stripped, sentences
split (``pysbd`` here, spaCy there), the first 100 kept, documents with < 10 sentences or < 3
images dropped. That cut and those size filters are the build's ``wiki`` filter preset, not this
connector's: a document here carries all its sentences (up to a hard 1000, to bound memory) so
the filter's counts stay right.

**mode=imageclef**: ``all_text/metadata/<dir>/<id>.xml`` (or ``metadata/``), one file per image,
as published indexers of the collection read it::

    <image id="1" file="images/1/1.jpg">
      <name>Foo.jpg</name>
      <text xml:lang="en">
        <description>...</description> <comment>...</comment>
        <caption article="text/en/1/249161">...</caption>
      </text> ...
    </image>

The ``article`` attribute names the article file relative to ``all_text/`` or the root, with or
without an extension; raw wikitext and wikitext wrapped in XML (``<article>`` / ``<page>`` with
``<title>``/``<name>`` and ``<text>``/``<body>``) are both accepted, since the exact article format
could not be verified. **mode=mediawiki**: docs/sources.md.
"""

from pipelines.sources.wiki.spec import SPEC  # what the source registry reads

__all__ = ["SPEC"]
