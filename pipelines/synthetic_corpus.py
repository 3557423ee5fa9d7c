"""Synthetic multi-image, multi-sentence documents with known links (the offline default corpus).

Rendered photos of objects and sentences describing some of them, with distractors on both sides
(as the paper's MSCOCO/Story-DII constructions). ``palette_similarity`` is the difficulty knob:
documents drawing from a 2-colour palette are told apart only by shape/size/position. Written as
``corpus.json``, ``documents.jsonl`` and ``images/``, read by ``pipelines.sources.synthetic``."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from schemas.config_fields import option, validate
from schemas.errors import MmlinksError

COLOURS = {
    "red": (210, 30, 35),
    "green": (40, 160, 60),
    "blue": (35, 70, 200),
    "yellow": (240, 210, 40),
    "orange": (240, 130, 20),
    "purple": (130, 50, 170),
    "pink": (245, 140, 190),
    "brown": (120, 75, 35),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "star", "cross", "ring", "diamond")
SIZES = {"small": (0.22, 0.30), "big": (0.48, 0.62)}
POSITIONS = {
    "top left": (0.3, 0.3),
    "top right": (0.7, 0.3),
    "bottom left": (0.3, 0.7),
    "bottom right": (0.7, 0.7),
    "middle": (0.5, 0.5),
}
PATTERNS = ("stripes", "checks", "dots", "plain")

TEMPLATES = (
    "here is the {size} {colour} {shape} in the {pos} corner on a {pattern} background",
    "this photo shows a {size} {colour} {shape} near the {pos}",
    "i painted a {colour} {shape} , it is {size} and sits at the {pos}",
    "the next step was adding a {size} {shape} in {colour}",
    "you can see the {colour} {shape} on the {pattern} wall",
    "finally a {colour} {shape} that came out {size}",
)
# Project vocabulary for the topic confound: a document picks one project and its sentences all
# mention it, as every sentence of a real r/DIY post talks about the same build.
TOPICS = (
    ("walnut", "bookshelf", "sanding"),
    ("kitchen", "backsplash", "tiles"),
    ("garden", "planter", "cedar"),
    ("bathroom", "vanity", "grout"),
    ("garage", "workbench", "plywood"),
    ("nursery", "crib", "paint"),
    ("porch", "swing", "stain"),
    ("attic", "insulation", "drywall"),
    ("deck", "railing", "screws"),
    ("bedroom", "headboard", "fabric"),
    ("fence", "gate", "hinges"),
    ("closet", "shelving", "brackets"),
    ("patio", "pavers", "gravel"),
    ("laundry", "cabinet", "doors"),
    ("office", "desk", "oak"),
    ("pantry", "drawers", "maple"),
)
TOPIC_GLUE = ("for the", "on my", "in the", "with the")

FILLER = (
    "thanks for reading and let me know what you think",
    "this project took me about two weekends in total",
    "i bought most of the supplies at the local hardware store",
    "sorry for the bad lighting in some of these",
    "edit : a few people asked about the cost , it was cheap",
    "my wife says it looks great but i am not so sure",
)


@dataclass
class SynthConfig:
    """The corpus generator's options (the `data synth` flags and the Dagster ``synthetic`` settings)."""

    docs: int = option(600, help="number of documents", at_least=1)
    seed: int = option(0, help="random seed")
    images_min: int = option(3, help="min linked images per document", at_least=1)
    images_max: int = option(6, help="max linked images per document", at_least=1)
    extra_sentence_rate: float = option(0.3, help="distractor sentences per linked image", at_least=0)
    extra_image_rate: float = option(0.2, help="distractor images per linked image", at_least=0)
    palette_similarity: float = option(
        0.2,
        help="share of documents whose objects share a 2-colour palette; higher is harder",
        within=(0, 1),
    )
    image_size: int = option(128, help="image side in pixels", at_least=32)
    style_strength: float = option(
        0.0,
        help="confound: how strongly every image of a document shares one visual style (background, "
        "lighting, colour cast, camera noise); 0 = off, 1 = every image fully in the document's style",
        within=(0, 1),
    )
    topic_words: int = option(
        0,
        help="confound: this many topic words of the document's project added to every sentence, "
        "distractors included (0 = off)",
        check=lambda v: 0 <= v <= 6,
        rule="0 to 6",
    )
    topic_position: str = option(
        "end",
        help="where the topic words go in each sentence",
        choices=("start", "end", "random"),
    )

    def __post_init__(self) -> None:
        validate(self, "synthetic corpus options")
        if self.images_max < self.images_min:
            raise MmlinksError("invalid synthetic corpus options: need images_min <= images_max")


@dataclass
class ObjectSpec:
    shape: str
    colour: str
    size: str
    pos: str
    pattern: str
    background: tuple[int, int, int]


def _draw_shape(draw: ImageDraw.ImageDraw, spec: ObjectSpec, cx: float, cy: float, r: float) -> None:
    fill = COLOURS[spec.colour]
    outline = (0, 0, 0) if spec.colour != "black" else (90, 90, 90)
    if spec.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill, outline=outline, width=2)
    elif spec.shape == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=max(3, int(r * 0.35)))
    elif spec.shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill, outline=outline, width=2)
    elif spec.shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill, outline=outline)
    elif spec.shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill, outline=outline)
    elif spec.shape == "star":
        pts = []
        for k in range(10):
            rad = r if k % 2 == 0 else r * 0.42
            a = -math.pi / 2 + k * math.pi / 5
            pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
        draw.polygon(pts, fill=fill, outline=outline)
    elif spec.shape == "cross":
        w = r * 0.35
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
    else:  # pragma: no cover - SHAPES is closed
        raise ValueError(spec.shape)


@dataclass
class DocumentStyle:
    """What every image of one document shares when the style confound is on (a camera, a room,
    a light): the background colour, a lighting field, a colour cast and sensor noise."""

    strength: float
    background: tuple[int, int, int]
    light: list[int]  # the 4x4 brightness field
    cast: tuple[float, float, float]  # per-channel gain
    noise: float  # Gaussian sensor noise, grey levels


def document_style(seed: int, index: int, strength: float) -> DocumentStyle | None:
    """The document's style from its own random stream (the corpus without it is unchanged)."""
    if strength <= 0:
        return None
    rng = random.Random(f"{seed}:{index}:style")
    return DocumentStyle(
        strength=strength,
        background=tuple(rng.randint(40, 230) for _ in range(3)),  # type: ignore[arg-type]
        light=[rng.randint(0, 255) for _ in range(16)],
        cast=tuple(rng.uniform(0.6, 1.4) for _ in range(3)),  # type: ignore[arg-type]
        noise=rng.uniform(0.0, 24.0),
    )


def _styled(img: Image.Image, style: DocumentStyle, rng: random.Random) -> Image.Image:
    """Blend the image towards the document's style: its light, colour cast and noise."""
    s = style.strength
    field = Image.new("L", (4, 4))
    field.putdata(style.light)
    field = field.resize(img.size, Image.BICUBIC)
    light = (np.asarray(field, dtype=np.float32)[..., None] - 128.0) * (100.0 / 128.0)
    pixels = np.asarray(img, dtype=np.float32) + s * light
    gain = 1.0 + s * (np.asarray(style.cast, dtype=np.float32) - 1.0)
    pixels = pixels * gain
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, s * style.noise, pixels.shape)
    return Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8))


def render(
    spec: ObjectSpec, size: int, rng: random.Random, style: DocumentStyle | None = None
) -> Image.Image:
    """A textured background with one object; jitter keeps no two renders identical."""
    bg = spec.background
    if style is not None:  # the document's room: its background, blended by the strength
        bg = tuple(round((1 - style.strength) * a + style.strength * b) for a, b in zip(bg, style.background))
    img = Image.new("RGB", (size, size), bg)
    draw = ImageDraw.Draw(img)
    alt = tuple(max(0, min(255, c + rng.choice((-45, 45)))) for c in bg)
    step = rng.randint(8, 16)
    if spec.pattern == "stripes":
        for x in range(-size, size * 2, step * 2):
            draw.line([(x, 0), (x + size, size)], fill=alt, width=step // 2)
    elif spec.pattern == "checks":
        for y in range(0, size, step):
            for x in range((y // step % 2) * step, size, step * 2):
                draw.rectangle([x, y, x + step - 1, y + step - 1], fill=alt)
    elif spec.pattern == "dots":
        for _ in range(size // 3):
            x, y = rng.uniform(0, size), rng.uniform(0, size)
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=alt)
    lo, hi = SIZES[spec.size]
    r = rng.uniform(lo, hi) * size / 2
    px, py = POSITIONS[spec.pos]
    cx = (px + rng.uniform(-0.05, 0.05)) * size
    cy = (py + rng.uniform(-0.05, 0.05)) * size
    _draw_shape(draw, spec, cx, cy, r)
    img = img.filter(ImageFilter.GaussianBlur(radius=rng.uniform(0.0, 0.8)))
    img = _relight(img, rng)
    return img if style is None else _styled(img, style, rng)


def _relight(img: Image.Image, rng: random.Random, cells: int = 4, strength: int = 100) -> Image.Image:
    """Add smooth random lighting (a 4x4 brightness field, upsampled).

    Real photos differ in their low frequencies; without this, renders that share a shape,
    size and position get perceptual hashes within a few bits, and near-duplicate removal
    (rightly) drops them as duplicates.
    """
    field = Image.new("L", (cells, cells))
    field.putdata([rng.randint(0, 255) for _ in range(cells * cells)])
    field = field.resize(img.size, Image.BICUBIC)
    light = np.asarray(field, dtype=np.int16)[..., None] - 128
    pixels = np.asarray(img, dtype=np.int16) + light * strength // 128
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def describe(spec: ObjectSpec, rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(
        size=spec.size, colour=spec.colour, shape=spec.shape, pos=spec.pos, pattern=spec.pattern
    )


def _random_spec(rng: random.Random, colours: list[str]) -> ObjectSpec:
    bg = tuple(rng.randint(90, 200) for _ in range(3))
    return ObjectSpec(
        shape=rng.choice(SHAPES),
        colour=rng.choice(colours),
        size=rng.choice(list(SIZES)),
        pos=rng.choice(list(POSITIONS)),
        pattern=rng.choice(PATTERNS),
        background=bg,  # type: ignore[arg-type]
    )


def _poisson(rng: random.Random, lam: float) -> int:
    # Knuth's method: lam is small here (a few distractors per document).
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def with_topic(text: str, cfg: SynthConfig, index: int, k: int) -> str:
    """``text`` mentioning the document's project (``cfg.topic_words`` words of one topic, plus
    a second topic's words past three), at the start, the end, or either."""
    rng = random.Random(f"{cfg.seed}:{index}:topic")  # the same project for every sentence
    first, second = rng.sample(range(len(TOPICS)), 2)
    words = [*TOPICS[first], *TOPICS[second]][: cfg.topic_words]
    pick = random.Random(f"{cfg.seed}:{index}:topic:{k}")
    phrase = f"{pick.choice(TOPIC_GLUE)} {' '.join(words)}"
    where = cfg.topic_position if cfg.topic_position != "random" else pick.choice(("start", "end"))
    return f"{phrase} {text}" if where == "start" else f"{text} {phrase}"


def _confound_metadata(cfg: SynthConfig, index: int) -> dict[str, str]:
    out = {}
    if cfg.style_strength > 0:
        out["style_strength"] = f"{cfg.style_strength:g}"
    if cfg.topic_words:
        rng = random.Random(f"{cfg.seed}:{index}:topic")
        out["topic"] = " ".join(TOPICS[rng.sample(range(len(TOPICS)), 2)[0]])
    return out


def generate_document(cfg: SynthConfig, index: int) -> tuple[dict, list[Image.Image]]:
    """One document and its images; depends only on (seed, index), so any slice is reproducible."""
    rng = random.Random(f"{cfg.seed}:{index}")
    hard = rng.random() < cfg.palette_similarity
    colours = rng.sample(list(COLOURS), 2) if hard else list(COLOURS)
    n_linked = rng.randint(cfg.images_min, cfg.images_max)
    n_extra_img = _poisson(rng, cfg.extra_image_rate * n_linked)
    n_extra_sent = _poisson(rng, cfg.extra_sentence_rate * n_linked)

    specs: list[ObjectSpec] = []
    seen: set[tuple[str, str, str]] = set()
    while len(specs) < n_linked + n_extra_img:
        spec = _random_spec(rng, colours)
        key = (spec.shape, spec.colour, spec.size)
        if key in seen and len(seen) < 2 * len(SHAPES):
            continue  # keep objects in one document distinguishable
        seen.add(key)
        specs.append(spec)
    rng.shuffle(specs)
    linked = sorted(rng.sample(range(len(specs)), n_linked))

    sentences: list[tuple[str, int]] = [(describe(specs[i], rng), i) for i in linked]
    for _ in range(n_extra_sent):
        if rng.random() < 0.5:
            sentences.append((rng.choice(FILLER), -1))
        else:  # a described object that is not in the document: a hard distractor
            spec = _random_spec(rng, list(COLOURS))
            while (spec.shape, spec.colour, spec.size) in seen:
                spec = _random_spec(rng, list(COLOURS))
            sentences.append((describe(spec, rng), -1))
    rng.shuffle(sentences)
    if cfg.topic_words:
        sentences = [(with_topic(text, cfg, index, k), img) for k, (text, img) in enumerate(sentences)]

    doc_id = f"synth-{cfg.seed}-{index:06d}"
    style = document_style(cfg.seed, index, cfg.style_strength)
    images = [render(s, cfg.image_size, rng, style) for s in specs]
    record = {
        "doc_id": doc_id,
        "sentences": [s for s, _ in sentences],
        "images": [f"images/{doc_id}/{k}.png" for k in range(len(images))],
        "links": [[si, img] for si, (_, img) in enumerate(sentences) if img >= 0],
        "metadata": {"palette": "shared" if hard else "free", **_confound_metadata(cfg, index)},
    }
    return record, images


def write_corpus(out: str | Path, cfg: SynthConfig, progress: Callable[[int], None] | None = None) -> Path:
    """Write the corpus under ``out``; returns the path of ``documents.jsonl``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.json").unlink(missing_ok=True)  # written last: its presence marks a complete corpus
    docs_path = out / "documents.jsonl"
    with docs_path.open("w") as fh:
        for i in range(cfg.docs):
            record, images = generate_document(cfg, i)
            for rel, img in zip(record["images"], images, strict=True):
                path = out / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                img.save(path, format="PNG", optimize=False)
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            if progress:
                progress(1)
    (out / "corpus.json").write_text(json.dumps({"format": "mmlinks-synthetic/1", **asdict(cfg)}, indent=2))
    return docs_path


def corpus_matches(out: str | Path, cfg: SynthConfig) -> bool:
    """True when ``out`` holds a complete corpus made with exactly ``cfg`` (so it can be reused)."""
    meta = Path(out) / "corpus.json"  # written last: its presence marks a complete corpus
    if not meta.exists() or not (Path(out) / "documents.jsonl").exists():
        return False
    try:
        saved = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(saved, dict) and all(saved.get(k) == v for k, v in asdict(cfg).items())
