"""The three album formats, each a pure function of the response text: the 2018 server-rendered
page (+ its ``hit.json`` fill-in), the current page's ``window.postDataJSON`` (a JavaScript string
literal holding JSON) and API v3.
"""

from __future__ import annotations

import json
import re

from pipelines.sources.imgur.album import (
    _MIME_EXT,
    _VALID_HASH,
    ANIMATED_EXTS,
    IMAGE_BASE,
    Album,
    AlbumImage,
    AlbumParseError,
    _clean_ext,
    _ext_from_url,
    _image,
    _text,
)
from schemas.text import repair_surrogates

# --------------------------------------------------------------------------------------------
# 2018 pages

_NUM_IMAGES_RE = re.compile(r'"?num_images"?\s*:\s*"?(\d+)')
_ALBUM_COUNT_RE = re.compile(r'"?album_images"?\s*:\s*\{\s*"?count"?\s*:\s*"?(\d+)')
_TRUNCATED_RE = re.compile(r"\b(?:js-post-truncated|post-loadall)\b")


def _declared_count_2018(text: str) -> int | None:
    counts = [int(m.group(1)) for rx in (_NUM_IMAGES_RE, _ALBUM_COUNT_RE) for m in rx.finditer(text)]
    return max(counts) if counts else None


def _has_container_class(value: object) -> bool:
    if value is None:
        return False
    classes = value if isinstance(value, (list, tuple)) else str(value).split()
    return "post-image-container" in classes


def parse_album_html_2018(html: str | bytes, *, album_id: str = "", image_base: str = IMAGE_BASE) -> Album:
    """Every ``div.post-image-container`` of a 2013-2018 album page, in page order.

    The container's ``id`` is the image hash. The extension comes from the container's own
    markup (``<img src>``, ``<a href>``, ``<source src>``, ``<meta itemprop=contentURL>``,
    ``data-ext``), ``jpg`` when it names none (the page served a placeholder until scrolled).
    Animated: a GIF/GIFV/MP4/WebM extension, a ``<video>`` element or ``itemtype`` VideoObject.
    The caption is the text of ``.post-image-description`` inside the container, ``<br>`` as a
    space and whitespace normalised; empty means no caption. Containers without an id are
    counted in ``skipped``. ``complete`` is False when the page declares more images than it
    inlines (``"num_images"``) or shows the "load more" marker.
    """
    from bs4 import BeautifulSoup, SoupStrainer

    text = _text(html)
    if "post-image-container" not in text:
        raise AlbumParseError("no_album_markup", "no div.post-image-container")
    # Only the containers are built into a tree (the page is mostly script and chrome). The
    # strainer sees the raw class string, so match one class among several by hand.
    strainer = SoupStrainer("div", attrs={"class": _has_container_class})
    soup = BeautifulSoup(text, "html.parser", parse_only=strainer)
    containers = soup.find_all("div", class_="post-image-container")
    if not containers:
        raise AlbumParseError("no_album_markup", "no div.post-image-container")
    images: list[AlbumImage] = []
    skipped = repaired = 0
    seen_nested: set[int] = set()
    for div in containers:
        if id(div) in seen_nested:
            continue
        for inner in div.find_all("div", class_="post-image-container"):
            seen_nested.add(id(inner))  # a malformed page nesting containers: the outer one counts
        image_hash = (div.get("id") or "").strip()
        if not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        ext = _clean_ext(div.get("data-ext"))
        urls = [
            el.get(attr)
            for el, attr in (
                *((el, "src") for el in div.find_all(["img", "source", "video"])),
                *((el, "href") for el in div.find_all("a")),
                *((el, "content") for el in div.find_all("meta")),
            )
        ]
        url_exts = [e for e in (_ext_from_url(u, image_hash) for u in urls) if e]
        ext = ext or (url_exts[0] if url_exts else None)
        itemtype = str(div.get("itemtype") or "")
        animated = (
            "VideoObject" in itemtype
            or div.find("video") is not None
            or any(e in ANIMATED_EXTS for e in url_exts)
        )
        desc = div.find(class_="post-image-description")
        caption = None
        if desc is not None:
            for br in desc.find_all("br"):
                br.replace_with(" ")
            caption = desc.get_text()
        image, fixed = _image(image_hash, ext, caption, animated, image_base)
        images.append(image)
        repaired += fixed
    declared = _declared_count_2018(text)
    truncated = bool(_TRUNCATED_RE.search(text)) or (declared is not None and declared > len(images))
    return Album(
        album_id,
        images,
        "html-2018",
        declared_count=declared,
        complete=not truncated,
        skipped=skipped,
        captions_repaired=repaired,
    )


def parse_album_hit_json(body: str | bytes, *, album_id: str = "", image_base: str = IMAGE_BASE) -> Album:
    """The 2018 "load more" endpoint ``/ajaxalbums/getimages/<id>/hit.json``.

    ``{"data": {"count": N, "images": [{"hash", "ext": ".jpg", "description", "animated",
    "title", ...}]}, "success": true, "status": 200}``; an unknown album answered
    ``{"data": [], ...}``, which becomes ``album_not_found``.
    """
    try:
        payload = json.loads(_text(body))
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise AlbumParseError("bad_album_json", "hit.json: nested too deeply") from None
    except ValueError as exc:
        raise AlbumParseError("bad_album_json", f"hit.json: {exc}") from None
    data = payload.get("data") if isinstance(payload, dict) else None
    if data == []:
        raise AlbumParseError("album_not_found", "hit.json: empty data")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise AlbumParseError("bad_album_json", "hit.json: no data.images list")
    images, skipped, repaired = [], 0, 0
    for item in data["images"]:
        image_hash = item.get("hash") if isinstance(item, dict) else None
        if not isinstance(image_hash, str) or not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        ext = _clean_ext(item.get("ext"))
        animated = bool(item.get("animated")) or bool(item.get("prefer_video"))
        image, fixed = _image(image_hash, ext, item.get("description"), animated, image_base)
        images.append(image)
        repaired += fixed
    count = data.get("count")
    declared = count if isinstance(count, int) and not isinstance(count, bool) else None
    return Album(
        album_id, images, "html-2018", declared_count=declared, skipped=skipped, captions_repaired=repaired
    )


# --------------------------------------------------------------------------------------------
# Current pages: window.postDataJSON="..."


class JsStringError(ValueError):
    pass


_JS_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "v": "\v"}
_JS_ESCAPE_RE = re.compile(
    r"\\(u\{[0-9A-Fa-f]{1,6}\}|u[0-9A-Fa-f]{4}|x[0-9A-Fa-f]{2}|0(?![0-9])|\r\n|[\s\S])"
)


def _js_escape(m: re.Match) -> str:
    esc = m.group(1)
    head = esc[0]
    if head == "u" and len(esc) > 1:
        code = int(esc[2:-1] if esc[1] == "{" else esc[1:], 16)
        if code > 0x10FFFF:
            raise JsStringError(f"code point out of range: \\{esc}")
        return chr(code)
    if head == "x" and len(esc) == 3:
        return chr(int(esc[1:], 16))
    if head in "ux":
        raise JsStringError(f"malformed escape \\{esc}")
    if esc == "0":
        return "\0"
    if esc in ("\r\n", "\n", "\r", "\u2028", "\u2029"):
        return ""  # line continuation
    return _JS_SIMPLE.get(esc, esc)  # \" \' \\ \/ and any other identity escape


def decode_js_string(body: str, *, repair: bool = True) -> str:
    """The value of a JavaScript string literal's body (without its quotes).

    Handles ``\\n``-style escapes, ``\\xHH``, ``\\uHHHH`` (surrogate pairs joined), ``\\u{H..}``,
    line continuations and identity escapes such as ``\\'``, which JSON would reject. With
    ``repair`` a lone surrogate becomes U+FFFD; without, surrogates are left as decoded (the
    album parser repairs and counts them caption by caption).
    """
    if re.search(r"(?<!\\)(?:\\\\)*\\\Z", body):
        raise JsStringError("dangling backslash")
    out = _JS_ESCAPE_RE.sub(_js_escape, body)
    return repair_surrogates(out)[0] if repair else out


_POSTDATA_RE = re.compile(r"""window\.postDataJSON\s*=\s*(["'])""")
# The body of a string literal up to its closing quote (unrolled: linear, no backtracking).
_LITERAL_BODY = {q: re.compile(rf"[^{q}\\]*(?:\\[\s\S][^{q}\\]*)*") for q in "\"'"}


def _postdata_literal(text: str) -> str:
    m = _POSTDATA_RE.search(text)
    if m is None:
        raise AlbumParseError("no_album_markup", "no window.postDataJSON")
    stop = _LITERAL_BODY[m.group(1)].match(text, m.end()).end()
    if stop >= len(text) or text[stop] != m.group(1):
        raise AlbumParseError("bad_album_json", "window.postDataJSON string is not terminated")
    return text[m.end() : stop]


def parse_album_html_json(html: str | bytes, *, album_id: str = "", image_base: str = IMAGE_BASE) -> Album:
    """The ``media`` list of a current page's ``window.postDataJSON="..."``.

    The value is a JavaScript string literal holding JSON: it is decoded as JavaScript (imgur
    escapes ``'`` as ``\\'``) and then parsed as JSON. Each medium: ``id``, ``ext`` (bare,
    e.g. ``jpeg``), ``url``, ``type`` (``image``/``video``), ``mime_type`` and ``metadata``
    (``description``, ``is_animated``). Animated: ``is_animated``, a video type/MIME or a
    GIF/MP4 extension. The album's own ``image_count`` is not trusted (it can be 0 above a
    full list), so ``declared_count`` stays None.
    """
    text = _text(html)
    literal = _postdata_literal(text)
    try:
        payload = json.loads(decode_js_string(literal, repair=False))
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise AlbumParseError("bad_album_json", "postDataJSON: nested too deeply") from None
    except (JsStringError, ValueError) as exc:
        raise AlbumParseError("bad_album_json", f"postDataJSON: {exc}") from None
    media = payload.get("media") if isinstance(payload, dict) else None
    if not isinstance(media, list):
        raise AlbumParseError("bad_album_json", "postDataJSON has no media list")
    images, skipped, repaired = [], 0, 0
    for item in media:
        image_hash = item.get("id") if isinstance(item, dict) else None
        if not isinstance(image_hash, str) or not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        meta = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
        mime = str(item.get("mime_type") or "").lower()
        ext = _clean_ext(item.get("ext")) or _ext_from_url(item.get("url"), image_hash) or _MIME_EXT.get(mime)
        animated = (
            bool(meta.get("is_animated"))
            or item.get("type") == "video"
            or mime.startswith("video/")
            or mime == "image/gif"
        )
        image, fixed = _image(image_hash, ext, meta.get("description"), animated, image_base)
        images.append(image)
        repaired += fixed
    album_id = album_id or repair_surrogates(str(payload.get("id") or ""))[0]
    return Album(album_id, images, "html-json", skipped=skipped, captions_repaired=repaired)


# --------------------------------------------------------------------------------------------
# API v3


def parse_album_api_v3(
    body: str | bytes | dict, *, album_id: str = "", image_base: str = IMAGE_BASE
) -> Album:
    """``GET /3/album/{id}/images``: ``{"data": [image, ...], "success": true, "status": 200}``.

    Image fields used: ``id``, ``link`` (its extension), ``type`` (MIME, the fallback for the
    extension), ``description``, ``animated``. A body with ``success: false`` and status 404 is
    ``album_not_found``; any other shape is ``bad_album_json``.
    """
    if isinstance(body, dict):
        payload = body
    else:
        try:
            payload = json.loads(_text(body))
        except RecursionError:  # nesting deeper than the interpreter's stack
            raise AlbumParseError("bad_album_json", "API v3: nested too deeply") from None
        except ValueError as exc:
            raise AlbumParseError("bad_album_json", f"API v3: {exc}") from None
    if not isinstance(payload, dict):
        raise AlbumParseError("bad_album_json", "API v3: not an object")
    if payload.get("success") is False:
        if payload.get("status") == 404:
            raise AlbumParseError("album_not_found", "API v3: status 404")
        raise AlbumParseError("bad_album_json", f"API v3: success false, status {payload.get('status')}")
    data = payload.get("data")
    if not isinstance(data, list):
        raise AlbumParseError("bad_album_json", "API v3: data is not a list")
    images, skipped, repaired = [], 0, 0
    for item in data:
        image_hash = item.get("id") if isinstance(item, dict) else None
        if not isinstance(image_hash, str) or not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        mime = str(item.get("type") or "").lower()
        ext = _ext_from_url(item.get("link"), image_hash) or _MIME_EXT.get(mime)
        animated = bool(item.get("animated")) or mime.startswith("video/") or mime == "image/gif"
        image, fixed = _image(image_hash, ext, item.get("description"), animated, image_base)
        images.append(image)
        repaired += fixed
    return Album(album_id, images, "api-v3", skipped=skipped, captions_repaired=repaired)
