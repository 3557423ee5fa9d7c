"""A synthetic multi-source, bilingual news corpus (issue #18, Liu et al. "Upgrading the
Newsroom") in the news JSONL layout that ``data build --source news-jsonl`` reads.

Why sources of different worth: each names each attribute with its own probability
(``MENTIONS``) and goes missing at its own rate (``PRESENCE``), so fusion and random_drop are
measurable. ``en`` and ``de`` share an aligned lexicon and vectors for the multilingual recipes.
Issue #34's options (``complementary``, ``names``, ``unseen_forms``) are off by default, leaving
earlier corpora byte for byte as they were."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

from pipelines.synthetic_corpus import COLOURS, PATTERNS, POSITIONS, SHAPES, SIZES, ObjectSpec, render
from schemas.config_fields import option, validate
from schemas.news import NEWS_SOURCES

FORMAT = "mmlinks-synthetic-news/1"
SOURCES = NEWS_SOURCES
ATTRIBUTES = ("colour", "shape", "size", "pos", "pattern")

# P(source names attribute): complementary on purpose (see the module docstring)
MENTIONS: dict[str, dict[str, float]] = {
    "headline": {"colour": 0.9, "shape": 0.3},
    "lead": {"size": 0.9, "pattern": 0.8, "shape": 0.3},
    "body": {"colour": 0.4, "shape": 0.4, "size": 0.4, "pos": 0.4, "pattern": 0.4},
    "caption": {"shape": 0.8, "pos": 0.9},
}
PRESENCE = {"headline": 1.0, "lead": 0.85, "body": 0.9, "caption": 0.75}
# --complementary: every source names attributes no other source names
COMPLEMENTARY: dict[str, dict[str, float]] = {
    "headline": {"colour": 1.0},
    "lead": {"size": 1.0, "pattern": 1.0},
    "body": {"pos": 1.0},
    "caption": {"shape": 1.0},
}
# --names: an invented name for every attribute value (a multi-word value is one name)
NAMES = {
    "red": "velmorra", "green": "quistobel", "blue": "dranvelt", "yellow": "osterwick",
    "orange": "branzuela", "purple": "kelvadore", "pink": "mirtabelle", "brown": "holgraven",
    "white": "fenwirral", "black": "zandoriel", "circle": "tremaskin", "square": "gulbranix",
    "triangle": "pellowind", "star": "corvantis", "cross": "wyndelmar", "ring": "sarvolent",
    "diamond": "ebrathune", "small": "lindquorra", "big": "mostravel", "top left": "harnesbury",
    "top right": "caldowyne", "bottom left": "prescovia", "bottom right": "ulvermoor",
    "middle": "tassenford", "stripes": "rondevique", "checks": "belvastor", "dots": "quimbarrow",
    "plain": "ostravenne",
}  # fmt: skip
NAME_WORDS = frozenset(NAMES.values())
FORM_SUFFIXES = ("s", "en", "a")  # inflections; unseen_form also drops or doubles a letter

# Glue and filler words per source; the attribute words go between them.
GLUE = {
    "headline": (("news", "today"), ("city", "reports"), ("breaking", "story"), ("local", "event")),
    "lead": (("people", "saw", "a"), ("witnesses", "describe", "the"), ("reporters", "found", "the")),
    "body": (("the", "police", "said"), ("according", "to", "officials"), ("residents", "told", "us")),
    "caption": (("photo", "of", "the"), ("picture", "shows", "the"), ("image", "of", "a")),
}
FILLER = (
    ("the", "council", "will", "meet", "again", "next", "week"),
    ("traffic", "was", "slow", "in", "the", "morning"),
    ("the", "weather", "stayed", "cold", "and", "grey"),
    ("more", "news", "follows", "later", "today"),
)
NEARBY = ("also", "nearby", "was")

# en -> de, one word each way (an aligned lexicon: what MUSE gives for real languages)
LEXICON = {
    # attributes
    "red": "rot", "green": "gruen", "blue": "blau", "yellow": "gelb", "orange": "orangefarben",
    "purple": "lila", "pink": "rosa", "brown": "braun", "white": "weiss", "black": "schwarz",
    "circle": "kreis", "square": "quadrat", "triangle": "dreieck", "star": "stern", "cross": "kreuz",
    "ring": "reif", "diamond": "raute", "small": "klein", "big": "gross", "top": "oben",
    "bottom": "unten", "left": "links", "right": "rechts", "middle": "mitte", "stripes": "streifen",
    "checks": "karos", "dots": "punkte", "plain": "schlicht",
    # glue and filler
    "news": "nachrichten", "today": "heute", "city": "stadt", "reports": "meldet",
    "breaking": "eilmeldung", "story": "geschichte", "local": "lokales", "event": "ereignis",
    "people": "leute", "saw": "sahen", "a": "ein", "witnesses": "zeugen", "describe": "beschreiben",
    "the": "der", "reporters": "reporter", "found": "fanden", "police": "polizei", "said": "sagte",
    "according": "laut", "to": "zu", "officials": "beamten", "residents": "anwohner", "told": "sagten",
    "us": "uns", "photo": "foto", "of": "von", "picture": "bild", "shows": "zeigt", "image": "abbild",
    "council": "rat", "will": "wird", "meet": "tagen", "again": "wieder", "next": "naechste",
    "week": "woche", "traffic": "verkehr", "was": "war", "slow": "langsam", "in": "in",
    "morning": "morgen", "weather": "wetter", "stayed": "blieb", "cold": "kalt", "and": "und",
    "grey": "grau", "more": "mehr", "follows": "folgt", "later": "spaeter", "also": "auch",
    "nearby": "nahebei",
}  # fmt: skip


@dataclass
class NewsSynthConfig:
    """The options of `mmlinks data synth-news`."""

    articles: int = option(800, help="number of articles", at_least=1)
    seed: int = option(0, help="random seed")
    second_image_rate: float = option(
        0.25,
        help="share of articles with a second photo (the same object elsewhere, its own caption)",
        within=(0, 1),
    )
    second_language_rate: float = option(
        0.5,
        help="share of articles written in 'de' (a German-like language aligned word for word with 'en')",
        within=(0, 1),
    )
    start_date: str = option("2019-01-01", help="date of the first article (YYYY-MM-DD)")
    days: int = option(730, help="days the articles span, in article order", at_least=1)
    image_size: int = option(96, help="image side in pixels", at_least=32)
    vector_dim: int = option(
        32,
        help="size of the aligned word vectors written to vectors/en.vec and vectors/de.vec (what MUSE "
        "gives for real languages; for --multilingual); 0 = none",
        at_least=0,
    )
    vector_oov_rate: float = option(
        0.1,
        help="share of 'de' words left out of vectors/de.vec (out-of-vocabulary for the aligned vectors)",
        check=lambda v: 0 <= v < 1,
        rule="in [0, 1)",
    )
    complementary: bool = option(
        False,
        help="each source names its own attributes (headline colour, lead size and pattern, caption "
        "shape, body position): no single source suffices, fusion does (issue #34)",
    )
    names: bool = option(
        False,
        help="write every attribute value as an invented name ('velmorra' for red), untranslated",
    )
    unseen_forms: float = option(
        0.0,
        help="with --names: share of the LAST articles (0.1 = the default date split's test split) that "
        "write each name in a form never used before ('velmorran', 'velmora'): unseen words",
        within=(0, 1),
    )

    def __post_init__(self) -> None:
        validate(self, "synthetic news corpus options")
        dt.date.fromisoformat(self.start_date)  # a clear ValueError for a bad date
        if self.unseen_forms and not self.names:
            raise ValueError("synthetic news corpus options: unseen_forms needs names (--names)")


ISSUE_34_OPTIONS = {"complementary": False, "names": False, "unseen_forms": 0.0}


def attribute_words(spec: ObjectSpec, attribute: str, names: bool = False) -> list[str]:
    value = str(getattr(spec, attribute))
    return [NAMES[value]] if names else value.split()


def translate(words: list[str], language: str) -> list[str]:
    """English words -> the article's language (``de``: the lexicon, word for word; names stay)."""
    return list(words) if language == "en" else [w if w in NAME_WORDS else LEXICON[w] for w in words]


def unseen_form(name: str, rng: random.Random) -> str:
    """A form of ``name`` that no article without ``unseen_forms`` uses: a suffix, the last
    letter dropped, or an inner letter doubled (most of its character n-grams stay)."""
    kind = rng.randrange(len(FORM_SUFFIXES) + 2)
    if kind < len(FORM_SUFFIXES):
        return name + FORM_SUFFIXES[kind]
    if kind == len(FORM_SUFFIXES):
        return name[:-1]
    i = rng.randrange(2, len(name) - 1)
    return name[:i] + name[i] + name[i:]


def _random_object(rng: random.Random) -> ObjectSpec:
    return ObjectSpec(
        shape=rng.choice(SHAPES),
        colour=rng.choice(list(COLOURS)),
        size=rng.choice(list(SIZES)),
        pos=rng.choice(list(POSITIONS)),
        pattern=rng.choice(PATTERNS),
        background=tuple(rng.randint(90, 200) for _ in range(3)),  # type: ignore[arg-type]
    )


def source_text(
    source: str,
    spec: ObjectSpec,
    rng: random.Random,
    distractor: ObjectSpec | None = None,
    cfg: NewsSynthConfig | None = None,
) -> list[str]:
    """The English words of one source about ``spec`` (before translation)."""
    names = bool(cfg and cfg.names)
    mentions = COMPLEMENTARY if cfg and cfg.complementary else MENTIONS
    words = list(rng.choice(GLUE[source]))
    named = [a for a in ATTRIBUTES if rng.random() < mentions[source].get(a, 0.0)]
    for a in named:
        words += attribute_words(spec, a, names)
    if source == "body":
        body = [*rng.choice(FILLER), *words, *rng.choice(FILLER)]
        if distractor is not None:  # a second object in the story, not in the photo
            body += [
                *NEARBY,
                *attribute_words(distractor, "colour", names),
                *attribute_words(distractor, "shape", names),
            ]
        return body
    return words


def _rewrite_forms(text: str, rng: random.Random) -> str:
    return " ".join(unseen_form(w, rng) if w in NAME_WORDS else w for w in text.split(" "))


def generate_article(cfg: NewsSynthConfig, index: int) -> tuple[dict, list[Image.Image]]:
    """One article record (the news JSONL layout) and its photos; depends only on (seed, index)."""
    rng = random.Random(f"news:{cfg.seed}:{index}")
    language = "de" if rng.random() < cfg.second_language_rate else "en"
    event = _random_object(rng)
    distractor = _random_object(rng)
    specs = [event]
    if rng.random() < cfg.second_image_rate:
        other = [p for p in POSITIONS if p != event.pos]
        specs.append(ObjectSpec(**{**asdict(event), "pos": rng.choice(other)}))
    present = {s: rng.random() < PRESENCE[s] for s in SOURCES}
    present["headline"] = True  # every article has a headline
    texts = {
        s: " ".join(translate(source_text(s, event, rng, distractor, cfg), language))
        for s in ("headline", "lead", "body")
    }
    article_id = f"news-{cfg.seed}-{index:06d}"
    day = dt.date.fromisoformat(cfg.start_date) + dt.timedelta(
        days=min(cfg.days - 1, int(index * cfg.days / max(cfg.articles, 1)) + rng.randint(0, 1))
    )
    images, records = [], []
    for k, spec in enumerate(specs):
        caption = " ".join(translate(source_text("caption", spec, rng, cfg=cfg), language))
        images.append(render(spec, cfg.image_size, rng))
        records.append(
            {
                "uri": f"images/{article_id}-{k}.png",
                "caption": caption if present["caption"] else "",
                "object": f"{spec.size} {spec.colour} {spec.shape} {spec.pos} {spec.pattern}",
            }
        )
    if index >= cfg.articles * (1 - cfg.unseen_forms) and cfg.unseen_forms:  # its own rng: the
        forms = random.Random(f"forms:{cfg.seed}:{index}")  # rest of the corpus stays the same
        texts = {s: _rewrite_forms(t, forms) for s, t in texts.items()}
        for r in records:
            r["caption"] = _rewrite_forms(r["caption"], forms)
    record = {
        "article_id": article_id,
        "date": day.isoformat(),
        "language": language,
        "outlet": f"outlet-{rng.randint(1, 3)}",
        **{s: (texts[s] if present[s] else "") for s in ("headline", "lead", "body")},
        "images": records,
    }
    return record, images


def aligned_vectors(dim: int, seed: int = 0, noise: float = 0.1, oov_rate: float = 0.1) -> dict:
    """{"en": {word: vector}, "de": {...}}: random unit vectors for the English words, and for
    each ``de`` translation its English word's vector plus Gaussian noise of norm about
    ``noise`` (aligned spaces are close, not equal), except a ``oov_rate`` share of ``de`` words
    (chosen by a hash of the word) that get none."""
    import hashlib

    import numpy as np

    rng = np.random.default_rng(seed)
    en, de = {}, {}
    for word in sorted(LEXICON):
        v = rng.standard_normal(dim)
        en[word] = v / np.linalg.norm(v)
        t = LEXICON[word]
        if int(hashlib.sha256(f"{seed}:{t}".encode()).hexdigest()[:8], 16) / 2**32 >= oov_rate:
            de[t] = en[word] + noise * rng.standard_normal(dim) / np.sqrt(dim)
    return {"en": en, "de": de}


def write_vectors(folder: str | Path, dim: int, seed: int = 0, oov_rate: float = 0.1) -> list[Path]:
    """``folder/en.vec`` and ``folder/de.vec`` in the word2vec text layout (``n dim`` header)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for lang, table in aligned_vectors(dim, seed, oov_rate=oov_rate).items():
        path = folder / f"{lang}.vec"
        lines = [f"{len(table)} {dim}"] + [
            f"{w} " + " ".join(f"{x:.5f}" for x in v) for w, v in table.items()
        ]
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def write_news_corpus(
    out: str | Path, cfg: NewsSynthConfig, progress: Callable[[int], None] | None = None
) -> Path:
    """Write ``articles.jsonl`` + ``images/`` + ``corpus.json`` (last) under ``out``; returns the
    path of ``articles.jsonl``."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "corpus.json").unlink(missing_ok=True)  # written last: marks a complete corpus
    path = out / "articles.jsonl"
    with path.open("w") as fh:
        for i in range(cfg.articles):
            record, images = generate_article(cfg, i)
            for im, img in zip(record["images"], images, strict=True):
                img.save(out / im["uri"], format="PNG", optimize=False)
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            if progress:
                progress(1)
    if cfg.vector_dim:
        write_vectors(out / "vectors", cfg.vector_dim, cfg.seed, cfg.vector_oov_rate)
    options = {k: v for k, v in asdict(cfg).items() if ISSUE_34_OPTIONS.get(k, None) != v}  # as before
    meta = {"format": FORMAT, "languages": ["en", "de"], "sources": list(SOURCES), **options}
    (out / "corpus.json").write_text(json.dumps(meta, indent=2))
    return path
