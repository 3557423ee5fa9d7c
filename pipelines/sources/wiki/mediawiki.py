"""mode=mediawiki: article titles -> documents through the live MediaWiki API (``action=parse``
and ``prop=imageinfo``), one polite request at a time, finished articles kept in the crawl state.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import apache_beam as beam
from apache_beam import coders

from pipelines.crawl_state import CrawlState
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.wiki.common import HARD_MAX_SENTENCES, SOURCE
from pipelines.text_segmentation import html_to_text, split_sentences
from schemas.text import repair_strings

IMAGEINFO_BATCH = 50
MIN_IMAGE_SIDE = 100
_SKIP_MIMES = frozenset({"image/svg+xml", "image/gif"})
_FILE_HREF_RE = re.compile(r"(?:^|/|\./)(?:File|Image):([^?#]+)")


def normalize_title(title: str) -> str:
    """MediaWiki's title normalization for the main namespace: spaces, first letter upper-case."""
    title = " ".join(title.replace("_", " ").split())
    return title[:1].upper() + title[1:]


def parse_titles_line(raw: bytes) -> str | None:
    """A title from one line of the titles file (``#`` starts a comment: titles never hold one)."""
    line = raw.decode("utf-8").lstrip("\ufeff").split("#", 1)[0]
    title = normalize_title(line)
    return title or None


def file_names_in_html(html: str) -> list[str]:
    """Normalized file names linked from the rendered article, in order of appearance."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    names: list[str] = []
    for a in soup.find_all("a", href=True):
        match = _FILE_HREF_RE.search(unquote(a["href"]))
        if match:
            name = normalize_title(match.group(1))
            if name and name not in names:  # "File:" + only whitespace names no file
                names.append(name)
    return names


class ArticleFailed(Exception):
    """A permanent (recorded) or transient (not recorded) failure of one article."""

    def __init__(self, reason: str, detail: str, *, permanent: bool):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.permanent = permanent


def _bad_shape(detail: str) -> ArticleFailed:
    """A response that is JSON but not in the API's shape (a proxy's page, a changed API, a
    broken mirror): the article's dead letter, not a crash of the Beam step. Transient: the
    next build asks again."""
    return ArticleFailed("bad_response", detail, permanent=False)


def _field(obj: dict, key: str, kind: type, where: str):
    """``obj[key]`` when it is a ``kind``, else ``bad_response``. Missing, null or another empty
    value is an empty ``kind``: PHP writes an empty object as ``[]``."""
    value = obj.get(key)
    if not value and not isinstance(value, kind):
        return kind()
    if not isinstance(value, kind):
        raise _bad_shape(f"{where} is {type(value).__name__}, not {kind.__name__}")
    return value


def _image_info(info: dict) -> dict:
    """One ``imageinfo`` entry with its fields checked: ``url``/``mime`` strings, sides integers
    (the skip rules compare and the record stores them; ``"wide"`` must not reach ``int()``)."""
    out: dict = {}
    for key in ("url", "mime"):
        out[key] = _field(info, key, str, f"imageinfo.{key}")
    for key in ("width", "height"):
        side = info.get(key)
        if side is None:
            side = 0
        if isinstance(side, float) and side.is_integer():
            side = int(side)
        if isinstance(side, bool) or not isinstance(side, int):
            raise _bad_shape(f"imageinfo.{key} is {side!r:.40}, not an integer")
        out[key] = side
    return out


class MediaWikiArticles(beam.DoFn):
    """Title -> RawDocument via the MediaWiki action API, with a crawl-state record per article."""

    def __init__(self, client, api_base: str, image_host: str, state_root: str):
        self.client = client
        self.api_base = api_base.rstrip("/")
        self.api_url = f"{self.api_base}/w/api.php"
        self.image_host = image_host
        self.state_root = state_root
        self.state: CrawlState | None = None

    def setup(self):
        self.state = CrawlState(self.state_root)

    # -- HTTP --
    def _get_json(self, params: dict[str, str]) -> dict:
        from pipelines.web.policy import HttpError

        params = {**params, "format": "json", "formatversion": "2"}
        try:
            # The crawl-state record is this source's cache: API answers need no second copy.
            resp = self.client.get(self.api_url, params=params, use_cache=False)
        except HttpError as exc:
            raise ArticleFailed("fetch_failed", f"{exc.reason}: {exc.detail}", permanent=False) from exc
        if not 200 <= resp.status < 300:
            raise ArticleFailed("fetch_failed", f"HTTP {resp.status} from {resp.url}", permanent=False)
        try:
            data = repair_strings(resp.json())[0]  # escaped lone surrogates: no encoder takes them
        except (ValueError, RecursionError) as exc:
            raise ArticleFailed("bad_response", f"not JSON: {exc}", permanent=False) from exc
        if not isinstance(data, dict):
            raise ArticleFailed("bad_response", "JSON is not an object", permanent=False)
        error = data.get("error")
        if isinstance(error, dict):
            code = str(error.get("code", ""))
            info = str(error.get("info", ""))[:200]
            if code == "missingtitle":
                raise ArticleFailed("missing_title", info, permanent=True)
            if code in ("invalidtitle", "invalid-title"):
                raise ArticleFailed("invalid_title", info, permanent=True)
            raise ArticleFailed("api_error", f"{code}: {info}", permanent=False)
        return data

    def _image_infos(self, names: list[str]) -> dict[str, dict]:
        infos: dict[str, dict] = {}
        for start in range(0, len(names), IMAGEINFO_BATCH):
            batch = names[start : start + IMAGEINFO_BATCH]
            data = self._get_json(
                {
                    "action": "query",
                    "titles": "|".join(f"File:{n}" for n in batch),
                    "prop": "imageinfo",
                    "iiprop": "url|mime|size",
                }
            )
            query = _field(data, "query", dict, "query")
            for page in _field(query, "pages", list, "query.pages"):
                if not isinstance(page, dict):
                    raise _bad_shape("query.pages[] is not an object")
                title = _field(page, "title", str, "query.pages[].title")
                name = normalize_title(title.split(":", 1)[1] if ":" in title else title)
                info = (_field(page, "imageinfo", list, "query.pages[].imageinfo") or [None])[0]
                if isinstance(info, dict):
                    infos[name] = _image_info(info)
        return infos

    def fetch(self, title: str) -> dict:
        """The crawl-state record of one article (network); raises ``ArticleFailed``."""
        data = self._get_json({"action": "parse", "page": title, "prop": "text|images", "redirects": "1"})
        parse = data.get("parse")
        if not isinstance(parse, dict):
            raise ArticleFailed("bad_response", "no 'parse' object", permanent=False)
        html = parse.get("text", "")
        if isinstance(html, dict):  # formatversion=1 shape
            html = html.get("*", "")
        if not isinstance(html, str):
            raise _bad_shape(f"parse.text is {type(html).__name__}, not a string")
        api_images = _field(parse, "images", list, "parse.images")
        if not all(isinstance(n, str) for n in api_images):
            raise _bad_shape("parse.images holds a non-string")
        api_images = [normalize_title(n) for n in api_images]
        # Order of appearance in the article; files only the API lists (rare) go last.
        in_html = file_names_in_html(html)
        listed, shown = set(api_images), set(in_html)
        order = list(
            dict.fromkeys([n for n in in_html if n in listed] + [n for n in api_images if n not in shown])
        )
        infos = self._image_infos(order) if order else {}
        images, skipped = [], {}
        for name in order:
            info = infos.get(name)
            reason = self._skip_reason(info)
            if reason:
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            images.append(
                {
                    "name": name,
                    "url": info["url"],
                    "mime": info.get("mime", ""),
                    "width": info.get("width", 0),
                    "height": info.get("height", 0),
                }
            )
        page_title = _field(parse, "title", str, "parse.title")
        pageid = parse.get("pageid")
        if pageid is not None and (isinstance(pageid, bool) or not isinstance(pageid, (int, str))):
            raise _bad_shape(f"parse.pageid is {type(pageid).__name__}")
        return {
            "title": page_title or title,
            "pageid": str(pageid or ""),
            "text": html_to_text(html),
            "images": images,
            "skipped": skipped,
        }

    def _skip_reason(self, info: dict | None) -> str | None:
        if not info or not info.get("url"):
            return "no_imageinfo"
        mime = info.get("mime", "").lower()
        if mime in _SKIP_MIMES or not mime.startswith("image/"):
            return "mime"
        if info.get("width", 0) < MIN_IMAGE_SIDE or info.get("height", 0) < MIN_IMAGE_SIDE:
            return "small"
        try:
            netloc = urlsplit(info["url"]).netloc
        except ValueError:  # "http://[::1" and friends
            return "bad_url"
        if netloc.lower() != self.image_host.lower():
            return "foreign_host"
        return None

    def state_key(self, title: str) -> str:
        return f"{self.api_base}|{title}"

    def process(self, title: str) -> Iterator:
        assert self.state is not None
        key = self.state_key(title)
        record = self.state.get("article", key)
        if record is None:
            try:
                record = self.fetch(title)
            except ArticleFailed as exc:
                if exc.permanent:
                    self.state.put("article", key, {"failed": exc.reason, "detail": exc.detail})
                yield dead_letter("document", title, exc.reason, exc.detail)
                return
            self.state.put("article", key, record)
            count("articles_fetched")
            for reason, n in record["skipped"].items():
                count(f"images_skipped_{reason}", n)
        else:
            count("articles_from_state")
            if "failed" in record:
                yield dead_letter("document", title, record["failed"], record.get("detail", ""))
                return
        yield self.document(record, requested=title)

    def document(self, record: dict, requested: str) -> RawDocument:
        sentences = split_sentences(record["text"], HARD_MAX_SENTENCES)
        metadata = {"title": record["title"], "pageid": record["pageid"], "api_base": self.api_base}
        if requested != record["title"]:
            metadata["requested_title"] = requested
        count("documents_in")
        ident = record["pageid"] or record["title"].replace(" ", "_")
        return RawDocument(
            doc_id=f"wiki-{ident}",
            source=SOURCE,
            sentences=sentences,
            image_uris=[img["url"] for img in record["images"]],
            links=None,
            metadata=metadata,
        )


class ParseTitles(beam.DoFn):
    def process(self, raw: bytes) -> Iterator:
        try:
            title = parse_titles_line(raw)
        except UnicodeDecodeError as exc:
            yield dead_letter("line", raw[:80].decode("utf-8", "replace"), "not_utf8", str(exc))
            return
        if title:
            yield title


class ReadMediaWiki(beam.PTransform):
    """A file of article titles -> RawDocuments fetched from a MediaWiki API."""

    def __init__(self, titles_file: str, fetch_fn: MediaWikiArticles):
        super().__init__()
        self.titles_file = titles_file
        self.fetch_fn = fetch_fn

    def expand(self, pbegin):
        titles = (
            pbegin
            | "ReadTitles" >> beam.io.ReadFromText(self.titles_file, coder=coders.BytesCoder())
            | "ParseTitles" >> dead_lettered(ParseTitles(), "titles")
        )
        fetched = (
            titles.titles
            | "Distinct" >> beam.Distinct()
            | "Spread" >> beam.Reshuffle()
            | "Fetch" >> dead_lettered(self.fetch_fn)
        )
        # Two titles that redirect to one page give one document.
        documents = (
            fetched.documents
            | "KeyById" >> beam.Map(lambda d: (d.doc_id, d))
            | "GroupById" >> beam.GroupByKey()
            | "OnePerPage" >> beam.Map(_one_per_page)
        )
        dead = (titles[DEAD_LETTER], fetched[DEAD_LETTER]) | "FlattenDead" >> beam.Flatten()
        return {"documents": documents, DEAD_LETTER: dead}


def _one_per_page(element) -> RawDocument:
    _, docs = element
    docs = sorted(docs, key=lambda d: d.metadata.get("requested_title", ""))
    if len(docs) > 1:
        count("redirect_duplicates", len(docs) - 1)
    return docs[0]
