"""Imgur albums: URL parsing, page/API parsers and a scraper that remembers finished albums.

The paper (Hessel et al. 2019, supplement) scraped each r/DIY album page and took every
``div.post-image-container`` with its ``.post-image-description``. Imgur has changed three times
since, so there are three parsers, each a pure function of the response text:
- ``parse_album_html_2018``: the 2013-2018 server-rendered page the paper saw (also what web
  archives hold). Large albums inlined only their first images and declared the full count
  (``"num_images"``) and a "load more" button; the browser fetched the rest from
  ``/ajaxalbums/getimages/<id>/hit.json`` (``parse_album_hit_json``), and ``AlbumScraper`` does too.
- ``parse_album_html_json``: the current page's escaped ``window.postDataJSON="..."``.
- ``parse_album_api_v3``: the sanctioned route when ``IMGUR_CLIENT_ID`` is set.

Format facts were checked against public scrapers of each era (gallery-dl, yt-dlp, JDownloader):
the 2018 hit.json ``ext`` carries its leading dot (``".jpg"``) and sometimes a query
(``".jpg?1"``); ``postDataJSON`` escapes single quotes as ``\\'`` (not valid JSON, so the string is
decoded as a JavaScript literal first); current ``ext`` values are bare (``"jpeg"``).

JSON can carry lone UTF-16 surrogates (``"\\ud83d"`` decodes to a str no encoder accepts); every
caption is repaired (a lone surrogate becomes U+FFFD, a split pair is joined) and counted in
``captions_repaired``. Deeply nested JSON is ``bad_album_json`` like any other undecodable body.
Images are not fetched here: the build's image store fetches them.
"""

from __future__ import annotations

from pipelines.sources.imgur.album import (
    API_BASE,
    IMAGE_BASE,
    PAGE_BASE,
    Album,
    AlbumFailed,
    AlbumImage,
    AlbumParseError,
    album_id_from_url,
    parse_album_url,
)
from pipelines.sources.imgur.parsers import (
    decode_js_string,
    parse_album_api_v3,
    parse_album_hit_json,
    parse_album_html_2018,
    parse_album_html_json,
)
from pipelines.sources.imgur.scraper import AlbumScraper

__all__ = [
    "API_BASE",
    "IMAGE_BASE",
    "PAGE_BASE",
    "Album",
    "AlbumFailed",
    "AlbumImage",
    "AlbumParseError",
    "AlbumScraper",
    "album_id_from_url",
    "decode_js_string",
    "parse_album_api_v3",
    "parse_album_hit_json",
    "parse_album_html_2018",
    "parse_album_html_json",
    "parse_album_url",
]
