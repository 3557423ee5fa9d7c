"""Imgur albums: URL parsing, page/API parsers and a scraper that remembers finished albums.

Why three parsers (pure functions of the response text): Imgur changed since the paper, so
``parse_album_html_2018`` (with ``parse_album_hit_json`` for large albums) reads the page the
paper saw, ``parse_album_html_json`` today's, ``parse_album_api_v3`` the API with
``IMGUR_CLIENT_ID``; their formats were checked against public scrapers of each era. Lone UTF-16
surrogates in captions are repaired and counted (``captions_repaired``). Images are fetched by
the build's image store."""

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
