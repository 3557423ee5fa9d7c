"""Wikipedia articles as documents: the ImageCLEF Wikipedia collection (``mode=imageclef``) or the
live MediaWiki API (``mode=mediawiki``); layouts: docs/sources.md.

Why a document carries all its sentences (up to 1000): the paper's first-100 cut and size
filters are the build's ``wiki`` preset, so its counts stay right. Article files are read as raw
wikitext or wikitext wrapped in XML, since the exact format could not be verified."""

from pipelines.sources.wiki.spec import SPEC  # what the source registry reads

__all__ = ["SPEC"]
