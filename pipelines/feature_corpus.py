"""A feature-level corpus family with known links: handwritten-digit features, topics and looks
(``mmlinks data synth-features``, issues #44, #47, #60; docs/benchmarks-linking.md).

Why feature level: rendering and a CNN cannot reach real corpora's confound regime cheaply, and
100K-1M documents must be written in minutes. Images are real digits (``load_digits``) through
one fixed random layer (extractor ``digits-relu``), each linked sentence names its digit. Issue
#60's options use their own random stream and are recorded only when set, so earlier corpora stay
byte-identical. ``dataset`` writes shards + manifest directly; ``hessel`` the authors' files."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from schemas.config_fields import option, validate
from schemas.errors import MmlinksError

SOURCE = "feature-synth"
EXTRACTOR = ("digits-relu", "1")  # name, version of the fixed random layer below
LOOK_SHARING = ("none", "document", "topic", "topic+document")
LOOK_MIXING = ("added", "clipped", "scaled")
LAYOUTS = ("dataset", "hessel")
SPLIT_SHARE = {"train": 0.7, "val": 0.15, "test": 0.15}  # of the 1,797 digit bitmaps
MAX_IMAGES = 15  # per document: above 10 a digit repeats (at most twice)
# Options added after corpora were published (issue #47, #60): the manifest names one only when it
# differs from this value, so a corpus written without it keeps its bytes and version id.
LATER_DEFAULTS = {
    "topic_skew": 0.0,
    "looks_per_topic": 1,
    "look_share": 1.0,
    "feature_noise": 0.0,
    "extra_images": 0,
}

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Real English nouns (in GloVe): a topic is two of them, so 500 topics need no invented words.
NOUNS = (
    "walnut bookshelf kitchen tiles garden planter cedar bathroom vanity grout garage workbench "
    "plywood nursery crib porch swing stain attic insulation drywall deck railing fence gate hinges "
    "closet shelving brackets patio pavers gravel laundry cabinet office desk oak bedroom headboard "
    "fabric basement staircase banister roof gutter chimney window shutter curtain lamp mirror "
    "table chair sofa rug pantry stove oven sink faucet pipe boiler radiator ladder shed barn "
    "greenhouse pond fountain hammock pergola trellis mailbox doorbell lantern candle pottery "
    "quilt knitting sewing leather canvas mosaic marble granite copper brass bamboo pine maple"
).split()
FILLERS = (
    "here is the photo of a",
    "this picture shows the",
    "you can see a",
    "next i added the",
    "look at this",
    "finally the",
    "i drew a",
    "then came the",
)


@dataclass
class FeatureCorpusConfig:
    """The family's options (the `data synth-features` flags)."""

    docs: int = option(3000, help="training documents", at_least=1)
    val_docs: int = option(300, help="validation documents", at_least=1)
    test_docs: int = option(300, help="test documents", at_least=1)
    images_min: int = option(
        4, help="min images per document", check=lambda v: 2 <= v <= MAX_IMAGES, rule=f"2 to {MAX_IMAGES}"
    )
    images_max: int = option(
        7,
        help="max images per document (above 10 the digits repeat: a digit at most twice)",
        check=lambda v: 2 <= v <= MAX_IMAGES,
        rule=f"2 to {MAX_IMAGES}",
    )
    topics: int = option(40, help="number of topics K (documents draw one: --topic-skew)", at_least=1)
    topic_skew: float = option(
        0.0,
        help="how unequal the topics' sizes are: a topic of rank r is drawn with weight (r + 1) ** -skew "
        "(0 = uniform, 1 = Zipf's law, as in real forums)",
        check=lambda v: 0 <= v <= 4,
        rule="0 to 4",
    )
    look_sharing: str = option(
        "topic",
        help="who shares an image look: none, document (each its own), topic (every document of a "
        "topic), topic+document (both)",
        choices=LOOK_SHARING,
    )
    look_mixing: str = option(
        "added",
        help="how a look mixes into a feature: added (v + s l), clipped (max(0, v + s l)), scaled "
        "(v * exp(s l))",
        choices=LOOK_MIXING,
    )
    look_strength: float = option(
        2.0,
        help="the look's spread per channel in units of the content's (s); 0 = no look",
        at_least=0,
    )
    looks_per_topic: int = option(
        1,
        help="looks per topic: each image takes one of its topic's looks (1 = the whole topic one look)",
        check=lambda v: 1 <= v <= 16,
        rule="1 to 16",
    )
    look_share: float = option(
        1.0,
        help="share of the images that carry the look (the others show their content alone)",
        check=lambda v: 0 < v <= 1,
        rule="in (0, 1]",
    )
    feature_noise: float = option(
        0.0,
        help="Gaussian noise per image and channel, in units of the content's spread (0 = none)",
        check=lambda v: 0 <= v <= 10,
        rule="0 to 10",
    )
    topic_words: int = option(
        2,
        help="words naming the topic in each sentence (0 = off)",
        check=lambda v: 0 <= v <= 2,
        rule="0 to 2",
    )
    extra_sentences: int = option(
        0,
        help="distractor sentences per document (name the topic, no digit, no link)",
        at_least=0,
    )
    extra_images: int = option(
        0,
        help="distractor images per document (a digit no sentence names, no link; the document's look), "
        "placed among the linked ones",
        at_least=0,
    )
    dim: int = option(256, help="feature vector width", at_least=8)
    seed: int = option(0, help="random seed (topics, looks, documents)")
    shard_docs: int = option(10_000, help="documents per Parquet shard", at_least=1)
    layout: str = option(
        "dataset",
        help="dataset = versioned Parquet shards + manifest; hessel = docs.json + features.npy + "
        "id2row.json for `data import-hessel`",
        choices=LAYOUTS,
    )

    def __post_init__(self) -> None:
        validate(self)
        if self.images_min > self.images_max:
            raise MmlinksError(f"images_min ({self.images_min}) > images_max ({self.images_max})")
        if self.extra_images and self.images_max + self.extra_images > 10:
            raise MmlinksError(
                f"images_max + extra_images ({self.images_max} + {self.extra_images}) > 10: a distractor "
                "shows a digit no sentence of its document names"
            )


# ------------------------------------------------------------------------------ the features


def digit_bitmaps() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 handwritten digits as (pixels [N, 64] in [0, 1], labels [N])."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float64), d.target.astype(np.int64)


@functools.lru_cache(maxsize=4)
def extractor_layer(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed random layer (W [dim, 64], b [dim]) of ``digits-relu``: the same for every corpus
    of a width, whatever its seed, so features of two corpora live in one space. Drawn once per
    width (read-only): drawn per document it was ~40 % of the generator's time (issue #47)."""
    rng = np.random.default_rng(1234 + dim)
    w, b = rng.normal(0, 1 / 8, (dim, 64)), rng.normal(0, 0.25, dim)
    w.flags.writeable = b.flags.writeable = False
    return w, b


def content_features(pixels: np.ndarray, dim: int) -> np.ndarray:
    """pixels [N, 64] -> non-negative features [N, dim] (``ReLU(W x + b)``)."""
    w, b = extractor_layer(dim)
    return np.maximum(pixels @ w.T + b, 0.0)


def mix_look(v: np.ndarray, look: np.ndarray, mixing: str, strength: float, scale: np.ndarray) -> np.ndarray:
    """Features v [N, D] of images that share looks ``look`` [N, D] (unit spread per channel),
    ``scale`` [D] = the content's spread per channel -> mixed features [N, D]."""
    if strength == 0:
        return v
    if mixing == "scaled":
        return v * np.exp(strength * look * 0.5)
    mixed = v + strength * look * scale
    return np.maximum(mixed, 0.0) if mixing == "clipped" else mixed


# ------------------------------------------------------------------------------ the documents


@dataclass
class _World:
    """What every split shares: the topics' words and looks, the content spread, the bitmaps."""

    cfg: FeatureCorpusConfig
    pixels: np.ndarray
    labels: np.ndarray
    pools: dict[str, dict[int, np.ndarray]]  # split -> digit -> bitmap rows
    topic_words: list[tuple[str, str]]
    topic_looks: np.ndarray  # [K, D]
    scale: np.ndarray  # [D]
    more_looks: np.ndarray | None = None  # [K, L - 1, D]: a topic's looks after its first


def _world(cfg: FeatureCorpusConfig) -> _World:
    pixels, labels = digit_bitmaps()
    order = np.random.default_rng(99).permutation(len(labels))  # the bitmap split: fixed
    cut1 = int(len(order) * SPLIT_SHARE["train"])
    cut2 = cut1 + int(len(order) * SPLIT_SHARE["val"])
    parts = {"train": order[:cut1], "val": order[cut1:cut2], "test": order[cut2:]}
    pools = {s: {d: rows[labels[rows] == d] for d in range(10)} for s, rows in parts.items()}
    rng = np.random.default_rng([cfg.seed, 1])
    pairs = [(a, b) for i, a in enumerate(NOUNS) for b in NOUNS[i + 1 :]]
    chosen = rng.choice(len(pairs), size=cfg.topics, replace=cfg.topics > len(pairs))
    words = [pairs[i] for i in chosen]
    looks = rng.normal(0, 1, (cfg.topics, cfg.dim))
    scale = content_features(pixels[parts["train"]], cfg.dim).std(0) + 1e-3
    more = None
    if cfg.looks_per_topic > 1:  # a stream of its own: the first look of each topic is as before
        more = np.random.default_rng([cfg.seed, 4]).normal(
            0, 1, (cfg.topics, cfg.looks_per_topic - 1, cfg.dim)
        )
    return _World(cfg, pixels, labels, pools, words, looks, scale, more)


def _digits(rng: np.random.Generator, n_img: int) -> np.ndarray:
    """n_img digits, distinct up to 10 (the draw of every earlier corpus), then each at most twice."""
    if n_img <= 10:
        return rng.choice(10, size=n_img, replace=False)
    return np.concatenate([rng.permutation(10), rng.choice(10, size=n_img - 10, replace=False)])


def _image_looks(
    world: _World, extra: np.random.Generator, topic: int, own: np.ndarray, n_img: int
) -> np.ndarray:
    """The look of each of a document's images [n_img, D]: its topic's (one of the topic's looks
    per image), its document's own or both, zero on the images ``look_share`` leaves plain."""
    cfg = world.cfg
    look = np.zeros((n_img, cfg.dim))
    if cfg.look_sharing in ("topic", "topic+document"):
        if world.more_looks is None:
            look = look + world.topic_looks[topic]
        else:
            choices = np.vstack([world.topic_looks[topic][None], world.more_looks[topic]])
            look = look + choices[extra.integers(cfg.looks_per_topic, size=n_img)]
    if cfg.look_sharing in ("document", "topic+document"):
        look = look + own
    if cfg.look_sharing == "topic+document":
        look = look / np.sqrt(2.0)
    if cfg.look_share < 1:
        look = look * (extra.random(n_img) < cfg.look_share)[:, None]
    return look


def _sentence(rng: np.random.Generator, digit: int | None, topic: tuple[str, str], n_topic: int) -> str:
    filler = FILLERS[rng.integers(len(FILLERS))]
    words = [filler] + ([DIGIT_WORDS[digit]] if digit is not None else ["nothing", "new"])
    topic_part = list(topic[:n_topic]) if rng.random() < 0.5 else list(topic[:n_topic])[::-1]
    return " ".join(words + (["for", "the", *topic_part] if n_topic else []))


def split_documents(world: _World, split: str, n: int) -> Iterator[dict]:
    """The documents of one split, in order: {doc_id, topic, sentences, features [images, D], links}
    (``extra_images`` of the images unlinked)."""
    cfg = world.cfg
    rng = np.random.default_rng([cfg.seed, 2, ("train", "val", "test").index(split)])
    weights = np.arange(1, cfg.topics + 1, dtype=np.float64) ** -cfg.topic_skew
    # issue #60's draws (looks per image, who carries the look, noise): a stream of their own
    extra = np.random.default_rng([cfg.seed, 3, ("train", "val", "test").index(split)])
    for i in range(n):
        # uniform: the draw of every corpus written before the skew existed (byte-identical)
        topic = (
            int(rng.integers(cfg.topics))
            if cfg.topic_skew == 0
            else int(rng.choice(cfg.topics, p=weights / weights.sum()))
        )
        n_img = int(rng.integers(cfg.images_min, cfg.images_max + 1))
        digits = _digits(rng, n_img)
        rows = [int(rng.choice(world.pools[split][int(d)])) for d in digits]
        place = np.arange(n_img)  # where each linked image sits among the document's images
        if cfg.extra_images:  # distractors: digits no sentence names, at random places among the rest
            unnamed = extra.choice(np.setdiff1d(np.arange(10), digits), size=cfg.extra_images, replace=False)
            rows += [int(extra.choice(world.pools[split][int(d)])) for d in unnamed]
            order = extra.permutation(n_img + cfg.extra_images)
            rows = [rows[int(k)] for k in order]
            place = np.argsort(order)[:n_img]
        v = content_features(world.pixels[rows], cfg.dim)
        own = rng.normal(0, 1, cfg.dim)  # drawn always, so sharing does not shift later draws
        if cfg.feature_noise > 0:
            v = v + cfg.feature_noise * world.scale * extra.normal(0, 1, v.shape)
        if cfg.look_sharing != "none":
            look = _image_looks(world, extra, topic, own, len(rows))
            v = mix_look(v, look, cfg.look_mixing, cfg.look_strength, world.scale)
        sentences = [_sentence(rng, int(d), world.topic_words[topic], cfg.topic_words) for d in digits]
        links = [(k, int(place[k])) for k in range(n_img)]
        for _ in range(cfg.extra_sentences):
            sentences.append(_sentence(rng, None, world.topic_words[topic], cfg.topic_words))
        order = rng.permutation(len(sentences))  # sentences in a random order; links follow them
        where = {int(old): new for new, old in enumerate(order)}
        yield {
            "doc_id": f"{split}-{i:07d}",
            "topic": topic,
            "sentences": [sentences[int(k)] for k in order],
            "features": v.astype(np.float32),
            "links": sorted((where[s], im) for s, im in links),
        }


def _documents(split: str, docs: list[dict]):
    from schemas.document import Document, ImageRecord

    out = []
    for d in docs:
        images = [
            ImageRecord(
                content_id=hashlib.sha256(f"{d['doc_id']}:{k}".encode()).hexdigest(),
                uri=f"{d['doc_id']}/{k}",
                width=8,
                height=8,
                phash=None,
                features=f,
            )
            for k, f in enumerate(d["features"])
        ]
        out.append(
            Document(
                doc_id=d["doc_id"],
                source=SOURCE,
                split=split,
                sentences=d["sentences"],
                images=images,
                links=d["links"],
                metadata={"topic": str(d["topic"])},
            )
        )
    return out


def _sizes(cfg: FeatureCorpusConfig) -> dict[str, int]:
    return {"train": cfg.docs, "val": cfg.val_docs, "test": cfg.test_docs}


def write_dataset(out: Path, cfg: FeatureCorpusConfig, progress: Callable[[int], None] | None = None):
    """Versioned shards + manifest under ``out`` (the manifest last: it marks a whole dataset)."""
    from schemas.document import SCHEMA_VERSION
    from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo
    from schemas.shards import shard_bytes

    if (out / "manifest.json").exists():
        raise MmlinksError(f"{out} already holds a dataset; choose another --out")
    world = _world(cfg)
    # an option at its value from before it existed is left out: the same corpus keeps its version id
    params = {
        "feature_corpus": {
            k: v for k, v in asdict(cfg).items() if k not in LATER_DEFAULTS or v != LATER_DEFAULTS[k]
        }
    }
    staging = out / "versions" / "_writing"
    staging.mkdir(parents=True, exist_ok=True)
    shards: list[ShardInfo] = []
    for split, n in _sizes(cfg).items():
        it = split_documents(world, split, n)
        for part in range((n + cfg.shard_docs - 1) // cfg.shard_docs):
            batch = [next(it) for _ in range(min(cfg.shard_docs, n - part * cfg.shard_docs))]
            data = shard_bytes(_documents(split, batch))
            name = f"{split}-{part:05d}.parquet"
            (staging / name).write_bytes(data)
            shards.append(ShardInfo(name, split, len(batch), len(data), hashlib.sha256(data).hexdigest()))
            if progress:
                progress(len(batch))
    version = Manifest.version_id(shards, params)
    folder = out / "versions" / version
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    staging.rename(folder)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        dataset_version=version,
        source=SOURCE,
        counts={"splits": _sizes(cfg), "dropped": {}, "pipeline": {}},
        feature_extractor=FeatureExtractorInfo(EXTRACTOR[0], EXTRACTOR[1], cfg.dim),
        shards=[
            ShardInfo(f"versions/{version}/{s.path}", s.split, s.rows, s.bytes, s.sha256) for s in shards
        ],
        build_params=params,
    )
    manifest.write(out)
    return out / "manifest.json"


def write_hessel(out: Path, cfg: FeatureCorpusConfig, progress: Callable[[int], None] | None = None):
    """The authors' layout (``pipelines.sources.hessel``): every image an id, a row of features."""
    world = _world(cfg)
    docs: dict[str, list] = {}
    rows: list[np.ndarray] = []
    id2row: dict[str, int] = {}
    for split, n in _sizes(cfg).items():
        docs[split] = []
        for d in split_documents(world, split, n):
            by_image = {im: s for s, im in d["links"]}
            by_sentence = {s: im for s, im in d["links"]}
            images = []
            for k, f in enumerate(d["features"]):
                image_id = f"{d['doc_id']}/{k}"
                id2row[image_id] = len(rows)
                rows.append(f)
                images.append([image_id, by_image.get(k, -1)])
            sentences = [[t, by_sentence.get(s, -1)] for s, t in enumerate(d["sentences"])]
            docs[split].append([images, sentences, f"topic-{d['topic']}"])
            if progress:
                progress(1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "docs.json").write_text(json.dumps(docs))
    np.save(out / "features.npy", np.stack(rows).astype(np.float32))
    (out / "id2row.json").write_text(json.dumps(id2row))
    return out / "docs.json"


def write_feature_corpus(
    out: str | Path, cfg: FeatureCorpusConfig, progress: Callable[[int], None] | None = None
) -> Path:
    """Write the corpus in ``cfg.layout``; returns the manifest's (or docs.json's) path."""
    out = Path(out)
    return (write_hessel if cfg.layout == "hessel" else write_dataset)(out, cfg, progress)
