"""Plain text from wiki markup or rendered Wikipedia HTML, and sentence splitting.

Why ``pysbd`` (``clean=False``): close to the paper's spaCy sentencizer, needs no model download
and never rewrites the text. Text is what a reader sees in the body (templates, references,
tables, captions, categories go; headings break sentences; trailing apparatus sections are
dropped, else their link lists become sentences). Lines are hard breaks."""

from __future__ import annotations

import functools
import re

import mwparserfromhell
from mwparserfromhell import nodes as mw

# Tags whose content is not running text (or not visible at all).
_DROP_TAGS = frozenset(
    {
        "ref",
        "references",
        "math",
        "chem",
        "ce",
        "gallery",
        "imagemap",
        "timeline",
        "score",
        "graph",
        "syntaxhighlight",
        "source",
        "pre",
        "code",
        "hiero",
        "templatedata",
        "inputbox",
        "categorytree",
        "mapframe",
        "maplink",
        "table",  # both <table> and wiki tables ({| ... |}) parse as tag "table"
        "noinclude",
        "includeonly",
        "onlyinclude",
        "style",
        "script",
    }
)
_LIST_TAGS = frozenset({"li", "dt", "dd"})
_HIDDEN_NAMESPACES = frozenset({"file", "image", "media", "category"})
# Interlanguage links ([[de:Paris]], [[zh-yue:...]], [[simple:...]]) are not shown in the text.
# Only a known Wikipedia language code counts as a prefix, so [[CSI: Miami]] or [[Sri:...]] stay.
_WIKIPEDIA_LANGUAGES = frozenset(
    """
    aa ab ace ady af ak als alt am ami an ang anp ar arc ary arz as ast atj av avk awa ay az azb
    ba ban bar bat-smg bbc bcl be be-tarask be-x-old bew bg bh bi bjn blk bm bn bo bpy br bs btm bug
    bxr ca cbk-zam cdo ce ceb ch cho chr chy ckb co cr crh cs csb cu cv cy da dag de dga din diq dsb
    dtp dty dv dz ee el eml en eo es et eu ext fa fat ff fi fiu-vro fj fo fon fr frp frr fur fy ga
    gag gan gcr gd gl glk gn gom gor got gpe gu guc gur guw gv ha hak haw he hi hif ho hr hsb ht hu
    hy hyw hz ia iba id ie ig igl ii ik ilo inh io is it iu ja jam jbo jv ka kaa kab kbd kbp kcg kg
    kge ki kj kk kl km kn knc ko koi kr krc ks ksh ku kus kv kw ky la lad lb lbe lez lfn lg li lij
    lld lmo ln lo lrc lt ltg lv mad mai map-bms mdf mg mh mhr mi min mk ml mn mni mnw mo mos mr mrj
    ms mt mus mwl my myv mzn na nah nan nap nb nds nds-nl ne new ng nia nl nn no nov nqo nr nrm nso
    nup nv ny oc olo om or os pa pag pam pap pcd pcm pdc pfl pi pih pl pms pnb pnt ps pt pwn qu rm
    rmy rn ro roa-rup roa-tara rsk ru rue rup rw sa sah sat sc scn sco sd se sg sgs sh shi shn shy
    si simple sk skr sl sm smn sn so sq sr srn ss st stq su sv sw syl szl szy ta tay tcy tdd te tet
    tg th ti tig tk tl tly tn to tpi tr trv ts tt tum tw ty tyv udm ug uk ur uz ve vec vep vi vls
    vo vro wa war wo wuu xal xh xmf yi yo yue za zea zgh zh zh-classical zh-min-nan zh-yue zu
    """.split()
)
# Sections after which an article holds no running text.
END_SECTIONS = frozenset(
    {
        "references",
        "notes",
        "footnotes",
        "citations",
        "notes and references",
        "references and notes",
        "sources",
        "bibliography",
        "see also",
        "external links",
        "further reading",
    }
)
# Templates that put words into the sentence around them ({{lang|fr|Paris}}, {{nowrap|x}}).
_INLINE_TEXT_TEMPLATES = frozenset({"lang", "nowrap", "nobr", "small", "em", "sic", "var", "smallcaps"})

_MAGIC_WORD_RE = re.compile(r"__[A-Z]+__")
# Markup debris that must never survive (unbalanced brackets are plain text to the parser).
_DEBRIS_RE = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|<\s*/?\s*ref\b[^>]*>?", re.IGNORECASE)
_EMPTY_PARENS_RE = re.compile(r"\(\s*[,;:]?\s*\)")
_PARENS_LEAD_RE = re.compile(r"\(\s*[,;:]\s*")  # "(; la Ville)" after a dropped template
_SPACE_RE = re.compile(r"[ \t\u00a0\u2009\u200b]+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r" +([.,;:!?)])")


def _template_text(tpl: mw.Template) -> str:
    name = str(tpl.name).strip().lower()
    if name in _INLINE_TEXT_TEMPLATES and tpl.params:
        # {{lang|fr|text}}: the text is the last positional parameter.
        positional = [p for p in tpl.params if not p.showkey]
        if positional:
            return _render(positional[-1].value)
    if name in ("convert", "cvt") and len(tpl.params) >= 2:
        value, unit = (str(p.value).strip() for p in tpl.params[:2])
        return f"{value} {unit}"
    return ""


def _is_interlanguage(title: str, piped: bool) -> bool:
    """[[de:Berlin]]: a known language code, a colon and the foreign title right after it.

    A piped link or one with a space after the colon is an ordinary link ([[CSI: Miami|CSI]]).
    """
    prefix, colon, rest = title.partition(":")
    if piped or not colon or not rest or rest[0].isspace():
        return False
    return prefix.strip().lower() in _WIKIPEDIA_LANGUAGES


def _link_text(link: mw.Wikilink) -> str:
    title = str(link.title).strip()
    visible_colon = title.startswith(":")  # [[:Category:X]] is an ordinary visible link
    if not visible_colon and ":" in title:
        prefix = title.split(":", 1)[0].strip().lower()
        if prefix in _HIDDEN_NAMESPACES or _is_interlanguage(title, link.text is not None):
            return ""
    if link.text is not None:
        return _render(link.text)
    return title.lstrip(":")


def _render(code: mwparserfromhell.wikicode.Wikicode) -> str:
    out: list[str] = []
    for node in code.nodes:
        if isinstance(node, mw.Text):
            out.append(str(node.value))
        elif isinstance(node, mw.Wikilink):
            out.append(_link_text(node))
        elif isinstance(node, mw.Template):
            out.append(_template_text(node))
        elif isinstance(node, mw.Tag):
            tag = str(node.tag).strip().lower()
            if tag in _DROP_TAGS:
                continue
            if tag in _LIST_TAGS:
                if out and not out[-1].endswith("\n"):
                    out.append("\n")
            elif tag in ("br", "hr"):
                out.append("\n" if tag == "hr" else " ")
                continue
            if node.contents is not None and not node.self_closing:
                out.append(_render(node.contents))
            if tag in ("p", "div", "blockquote", "center"):
                out.append("\n")
        elif isinstance(node, mw.ExternalLink):
            # [http://x label] shows the label; bare URLs and [http://x] ("[1]") are noise.
            if node.title is not None and node.brackets:
                out.append(_render(node.title))
        elif isinstance(node, mw.HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, mw.Heading):
            out.append("\n\n")
        # Comments, arguments ({{{1}}}) and anything else render as nothing.
    return "".join(out)


def _drop_end_sections(code: mwparserfromhell.wikicode.Wikicode) -> None:
    """Remove everything from the first apparatus heading ("References", ...) onwards."""
    nodes = code.nodes
    for k, node in enumerate(nodes):
        if isinstance(node, mw.Heading) and _render(node.title).strip().lower() in END_SECTIONS:
            del nodes[k:]
            return


def _tidy(text: str) -> str:
    while True:  # removing debris can join two halves into new debris ("[<ref>[")
        cleaned = _DEBRIS_RE.sub("", text)
        if cleaned == text:
            break
        text = cleaned
    text = _MAGIC_WORD_RE.sub("", text)
    lines = []
    for line in text.split("\n"):
        line = _SPACE_RE.sub(" ", line)
        line = _EMPTY_PARENS_RE.sub("", line)
        line = _PARENS_LEAD_RE.sub("(", line)
        line = _SPACE_RE.sub(" ", line)
        line = _SPACE_BEFORE_PUNCT_RE.sub(r"\1", line).strip()
        lines.append(line)
    # Keep blank lines as paragraph breaks, but never more than one in a row.
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def strip_wiki_markup(text: str) -> str:
    """Readable article text from raw wikitext: one paragraph or list item per line."""
    code = mwparserfromhell.parse(text)
    _drop_end_sections(code)
    return _tidy(_render(code))


# --- rendered HTML (MediaWiki action=parse) -------------------------------------------------

# Elements of the rendered article that are not running text.
_HTML_DROP_SELECTORS = (
    "table",
    "figure",
    "figcaption",
    "sup",
    "style",
    "script",
    "math",
    ".reference",
    ".mw-ref",
    ".mw-editsection",
    ".infobox",
    ".navbox",
    ".vertical-navbox",
    ".sidebar",
    ".thumb",
    ".hatnote",
    ".noprint",
    ".metadata",
    ".mw-empty-elt",
    ".mwe-math-element",
    ".gallery",
    ".reflist",
    ".references",
)


def html_to_text(html: str) -> str:
    """Article text from rendered Wikipedia HTML: the main content's ``<p>`` paragraphs, one per line.

    Only paragraphs count (lists, tables, infoboxes, navboxes, figures and their captions are not
    running text); references, footnote markers and edit links inside paragraphs are removed.
    """
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    root = soup.select_one(".mw-parser-output") or soup
    for selector in _HTML_DROP_SELECTORS:
        for el in root.select(selector):
            el.decompose()
    paragraphs = []
    for p in root.find_all("p"):
        text = " ".join(p.get_text().split())
        if text:
            paragraphs.append(text)
    return _tidy("\n".join(paragraphs))


# --- sentences ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


_FALLBACK_SPLIT_RE = re.compile(r"(?<=[.!?])\s+")


def _alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


def _split_block(block: str) -> list[str]:
    pieces = _segmenter().segment(block)
    if _alnum("".join(pieces)) != _alnum(block):
        # pysbd can lose or reorder characters on unusual input; never lose text for it.
        pieces = _FALLBACK_SPLIT_RE.split(block)
    return pieces


def split_sentences(text: str, max_sentences: int | None = None) -> list[str]:
    """English sentences of ``text`` (pysbd), in order; every line break is a sentence break.

    Sentences without any letter or digit are dropped. ``max_sentences`` stops early (bounds the
    work on huge articles). Concatenated, the sentences keep every alphanumeric character of
    ``text`` in order (up to the cut).
    """
    out: list[str] = []
    for line in text.split("\n"):
        block = line.strip()
        if not block:
            continue
        for piece in _split_block(block):
            piece = piece.strip()
            if piece and any(ch.isalnum() for ch in piece):
                out.append(piece)
                if max_sentences is not None and len(out) >= max_sentences:
                    return out
    return out
