"""A synthetic coherence corpus: text-image pairs labelled with coherence relations, where a
relation carries information that a coherence-agnostic retrieval model does not use by itself.

Each pair shows a painted object as a result (``Visible``) or in progress (``Action``); the text
names the state only in ``cue_rate`` of the pairs, the relation label in all, so only a model that
uses the label learns the state (``train_states="one"`` confounds it further; ``Story`` is
decided by the text). ``salience="graded"`` (issue #45) renders a weak digit, a plain ink and a
dominant backdrop, each caption's relation deciding which it names, the truth in the metadata.
``data build --source synthetic`` builds it."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from pipelines.splits import parse_split_sizes, sized_assignment, split_rank_key, unit_hash
from pipelines.synthetic_corpus import COLOURS, PATTERNS, POSITIONS, SHAPES, SIZES, ObjectSpec, render
from schemas.config_fields import option, validate
from schemas.errors import MmlinksError
from schemas.manifest import ATTRIBUTE_PREFIX, NAMED_KEY

RELATIONS = ("Visible", "Action", "Story")
FORMAT = "mmlinks-synthetic-coherence/1"

RESULT_CUES = ("finished", "done", "complete", "ready", "final", "dried", "polished", "perfect")
ACTION_CUES = ("painting", "starting", "halfway", "filling", "brushing", "beginning", "colouring", "working")
STEP_TEMPLATES = (
    "the {colour} {shape} {cue}",
    "{cue} the {colour} {shape} at the {pos}",
    "here the {colour} {shape} is {cue}",
    "a {size} {colour} {shape} , {cue}",
    "step {n} : {cue} {colour} {shape}",
)
PLAIN_TEMPLATES = (
    "the {colour} {shape}",
    "a {size} {colour} {shape} at the {pos}",
    "step {n} : {colour} {shape}",
)
# graded salience (issue #45): the relations of its captions, the attributes and their values
GRADED_RELATIONS = ("Visible", "Meta", "Subjective", "Story", "Irrelevant")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
INKS = {"red": (205, 35, 40), "blue": (40, 70, 205), "green": (35, 150, 60), "black": (25, 25, 25)}
# backdrop -> (base colour, stripe colour or None)
BACKDROPS = {
    "grey": ((150, 150, 150), None),
    "sand": ((222, 200, 150), None),
    "striped": ((140, 185, 220), (245, 245, 245)),
}
# relation -> (its share of the pairs, caption templates, the attributes each template names)
GRADED_CAPTIONS: dict[str, tuple[float, tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "Visible": (
        0.6,
        (
            ("a {ink} {digit} on a {backdrop} background", ("digit", "ink", "backdrop")),
            ("the number {digit} written in {ink} on {backdrop} paper", ("digit", "ink", "backdrop")),
            ("{ink} ink , digit {digit} , {backdrop} card", ("digit", "ink", "backdrop")),
            ("here i wrote {digit} in {ink} over the {backdrop} sheet", ("digit", "ink", "backdrop")),
        ),
    ),
    "Meta": (
        0.1,
        (
            ("the shot was taken against the {backdrop} backdrop", ("backdrop",)),
            ("i used a {backdrop} card for this photo", ("backdrop",)),
        ),
    ),
    "Subjective": (
        0.12,
        (
            ("i love how this {ink} ink looks", ("ink",)),
            ("{ink} is such a cheerful colour", ("ink",)),
            ("{digit} is my favourite number", ("digit",)),
            ("i always liked writing {digit}", ("digit",)),
        ),
    ),
    "Story": (
        0.12,
        (
            ("my daughter wrote a {ink} {digit} after lunch", ("digit", "ink")),
            ("it was raining so we practised the {digit} in {ink}", ("digit", "ink")),
        ),
    ),
    "Irrelevant": (
        0.06,
        (
            ("what a long week it has been", ()),
            ("thanks for reading and see you soon", ()),
        ),
    ),
}
STORY_PHRASES = (
    "my daughter helped me with this one",
    "it was raining all weekend so",
    "after lunch i went back to the garage and",
    "this reminded me of my grandfather",
    "we had friends over that evening",
)


@dataclass
class CoherenceSynthConfig:
    """The options of `mmlinks data synth-coherence`."""

    pairs: int = option(3000, help="number of text-image pairs", at_least=2)
    seed: int = option(0, help="random seed")
    action_rate: float = option(
        0.5,
        help="share of pairs whose image shows the step in progress (Action)",
        within=(0, 1),
    )
    cue_rate: float = option(
        0.7,
        help="share of texts that name the state with a cue word",
        within=(0, 1),
    )
    story_rate: float = option(0.3, help="share of texts told as an anecdote (Story)", within=(0, 1))
    image_size: int = option(128, help="image side in pixels", at_least=32)
    cue_words: int = option(
        8,
        help="distinct cue words per state: up to 8 real words, more adds made-up rare tokens "
        "(act01, fin01, ...) that retrieval alone sees seldom while the relation label groups them",
        at_least=1,
    )

    objects: int = option(
        0,
        help=f"use only this many colour x shape objects, drawn by the seed (0: all "
        f"{len(COLOURS) * len(SHAPES)}); fewer objects put more images of the query's object in a pool",
        check=lambda v: 0 <= v <= len(COLOURS) * len(SHAPES),
        rule=f"0 to {len(COLOURS) * len(SHAPES)}",
    )
    split_sizes: dict[str, int] | None = option(
        None,
        help="the generator assigns the splits, written in each pair (`data build` keeps them): "
        "val=N,test=N (rest: train), the same pairs `data build --split-sizes` would pick",
        parse=parse_split_sizes,
        check=lambda v: v is None or (set(v) <= {"train", "val", "test"} and min(v.values(), default=0) >= 0),
        rule="counts of train, val or test",
        metavar="SPLIT=N,...",
    )
    train_states: str = option(
        "both",
        help="one: in training every object appears in one state only (Visible or Action, fixed per "
        "object), while val/test show both: the confound only the relation label resolves (needs "
        "--split-sizes)",
        choices=("both", "one"),
    )

    state_look: str = option(
        "half",
        help="how an in-progress step looks: half = half the object still background and a brush "
        "across it; brush = the whole object with a brush across it (a subtler state that leaves "
        "the object recognisable)",
        choices=("half", "brush"),
    )

    salience: str = option(
        "none",
        help="graded: the graded-salience corpus instead of the painting steps: a small handwritten "
        "digit (weak in the features) in one of 4 inks on one of 3 backdrops (dominant), captions "
        "naming a known subset (truth in each pair's metadata); the painting options do not apply; "
        "build it with `data build --dedupe-threshold off` (its plain backdrops look alike to the "
        "perceptual hash)",
        choices=("none", "graded"),
    )
    digit_scale: float = option(
        0.3,
        help="graded: the digit's side as a share of the image side (smaller: a weaker digit)",
        check=lambda v: 0.1 <= v <= 0.9,
        rule="in [0.1, 0.9]",
    )

    def __post_init__(self) -> None:
        validate(self, "synthetic coherence corpus options")
        if self.salience == "graded" and (self.train_states != "both" or self.objects):
            raise MmlinksError(
                "--salience graded draws its own attributes: drop --train-states and --objects"
            )
        if self.train_states == "one" and self.split_sizes is None:
            raise MmlinksError(
                "--train-states one needs --split-sizes (the generator must know the training pairs)"
            )

    def assigned_splits(self) -> dict[str, str] | None:
        """doc_id -> split when the generator assigns splits (``split_sizes``), else None."""
        if self.split_sizes is None:
            return None
        ids = sorted((doc_id(self, i) for i in range(self.pairs)), key=split_rank_key)
        return sized_assignment(ids, self.split_sizes)


def doc_id(cfg: CoherenceSynthConfig, index: int) -> str:
    return f"coh-{cfg.seed}-{index:06d}"


@lru_cache(maxsize=16)
def object_pool(seed: int, objects: int, action_rate: float) -> tuple[tuple[tuple[str, str], ...], frozenset]:
    """(the ``objects`` (colour, shape) pairs in use, those shown in progress in training).

    Both drawn by hashes of the seed: the pool is the first ``objects`` by one hash (all when 0),
    the Action objects the first ``round(action_rate * n)`` of the pool by another, so the
    training states split the objects exactly as ``action_rate`` says."""
    every = [(c, s) for c in COLOURS for s in SHAPES]
    pool = sorted(every, key=lambda o: unit_hash(f"{seed}:{o}", "object:"))[: objects or len(every)]
    ranked = sorted(pool, key=lambda o: unit_hash(f"{seed}:{o}", "train-state:"))
    return tuple(pool), frozenset(ranked[: round(action_rate * len(pool))])


def _in_progress(
    img: Image.Image, spec: ObjectSpec, bg: tuple[int, int, int], rng: random.Random, cover: bool = True
) -> Image.Image:
    """Cover one half of the object (the part not yet painted; ``cover``) and draw a brush at the edge."""
    size = img.size[0]
    px, py = POSITIONS[spec.pos]
    cx, cy = px * size, py * size
    r = SIZES[spec.size][1] * size / 2 + 0.06 * size
    draw = ImageDraw.Draw(img)
    right = rng.random() < 0.5  # drawn either way, so the other draws do not depend on ``cover``
    if cover and right:  # the right half still to do
        draw.rectangle([cx, cy - r, cx + r, cy + r], fill=bg)
    elif cover:  # the bottom half
        draw.rectangle([cx - r, cy, cx + r, cy + r], fill=bg)
    handle = (110, 70, 30)
    draw.line([(cx, cy), (cx + 0.35 * size, cy - 0.35 * size)], fill=handle, width=max(3, size // 20))
    draw.ellipse(
        [cx - size // 24, cy - size // 24, cx + size // 24, cy + size // 24], fill=COLOURS[spec.colour]
    )
    return img


def cue_list(action: bool, n: int) -> tuple[str, ...]:
    """The state's ``n`` cue words: the real ones first, then made-up tokens."""
    real = ACTION_CUES if action else RESULT_CUES
    made_up = tuple(f"{'act' if action else 'fin'}{k:02d}" for k in range(1, max(0, n - len(real)) + 1))
    return (real + made_up)[:n]


@lru_cache(maxsize=1)
def digit_bitmaps() -> tuple[np.ndarray, np.ndarray]:
    """(images [n, 8, 8] in 0..16, labels [n]) of scikit-learn's bundled handwritten digits."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def _digit_mask(bitmap: np.ndarray, side: int) -> Image.Image:
    """An 8 x 8 bitmap (0..16) scaled to ``side`` pixels and thresholded: an "L" stencil."""
    small = Image.fromarray(np.asarray(bitmap * 15.9, dtype=np.uint8), mode="L")
    return small.resize((side, side), Image.BILINEAR).point(lambda v: 255 if v > 96 else 0)


def generate_graded_pair(
    cfg: CoherenceSynthConfig, index: int, split: str | None = None
) -> tuple[dict, Image.Image]:
    """One graded-salience pair (``salience="graded"``); depends only on (the options, index,
    split): val/test pairs draw their bitmap from the held-out fifth (index % 5 == 0) when the
    generator assigns splits, training pairs from the rest."""
    rng = random.Random(f"coherence-graded:{cfg.seed}:{index}")
    images, labels = digit_bitmaps()
    pick = rng.randrange(len(images))
    if split is not None:  # move to the nearest bitmap of the right part, same digit stream
        held_out = split != "train"
        while (pick % 5 == 0) != held_out:
            pick = (pick + 1) % len(images)
    digit, ink, backdrop = str(int(labels[pick])), rng.choice(list(INKS)), rng.choice(list(BACKDROPS))
    size = cfg.image_size
    base, stripe = BACKDROPS[backdrop]
    jitter = rng.randint(-12, 12)
    img = Image.new("RGB", (size, size), tuple(min(255, max(0, c + jitter)) for c in base))
    draw = ImageDraw.Draw(img)
    if stripe is not None:
        step = max(4, size // 8)
        offset = rng.randrange(step)
        for x in range(-size, size, step):
            draw.polygon(
                [
                    (x + offset, 0),
                    (x + offset + step // 2, 0),
                    (x + offset + step // 2 + size, size),
                    (x + offset + size, size),
                ],
                fill=stripe,
            )
    side = max(8, round(size * cfg.digit_scale * rng.uniform(0.85, 1.15)))
    x0, y0 = rng.randint(0, size - side), rng.randint(0, size - side)
    img.paste(Image.new("RGB", (side, side), INKS[ink]), (x0, y0), _digit_mask(images[pick], side))
    names = list(GRADED_CAPTIONS)
    relation = rng.choices(names, weights=[GRADED_CAPTIONS[n][0] for n in names])[0]
    template, named = rng.choice(GRADED_CAPTIONS[relation][1])
    text = template.format(digit=DIGIT_WORDS[int(digit)], ink=ink, backdrop=backdrop)
    name = doc_id(cfg, index)
    values = {"digit": digit, "ink": ink, "backdrop": backdrop}
    record = {
        "doc_id": name,
        "sentences": [text],
        "images": [f"images/{name}.png"],
        "links": [[0, 0]],
        "metadata": {
            "relations": relation,
            NAMED_KEY: ",".join(named),
            "bitmap": str(pick),  # the load_digits index drawn
            **{ATTRIBUTE_PREFIX + k: v for k, v in values.items()},
        },
    }
    if split is not None:
        record["split"] = split
    return record, img


def generate_pair(
    cfg: CoherenceSynthConfig, index: int, split: str | None = None
) -> tuple[dict, Image.Image]:
    """One pair; depends only on (the options, index, split). ``split`` (from
    ``cfg.assigned_splits()``) is written in the record; with ``train_states="one"`` a training
    pair shows its object in the object's training state, every other draw stays the same."""
    if cfg.salience == "graded":
        return generate_graded_pair(cfg, index, split)
    rng = random.Random(f"coherence:{cfg.seed}:{index}")
    bg = tuple(rng.randint(90, 200) for _ in range(3))
    if cfg.objects:
        colour, shape = rng.choice(object_pool(cfg.seed, cfg.objects, cfg.action_rate)[0])
    else:  # the draws of the default corpus, kept so that it stays byte-identical
        shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
    spec = ObjectSpec(
        shape=shape,
        colour=colour,
        size=rng.choice(list(SIZES)),
        pos=rng.choice(list(POSITIONS)),
        pattern=rng.choice(PATTERNS),
        background=bg,  # type: ignore[arg-type]
    )
    action = rng.random() < cfg.action_rate
    if split == "train" and cfg.train_states == "one":
        action = (spec.colour, spec.shape) in object_pool(cfg.seed, cfg.objects, cfg.action_rate)[1]
    story = rng.random() < cfg.story_rate
    fields = {
        "colour": spec.colour,
        "shape": spec.shape,
        "size": spec.size,
        "pos": spec.pos,
        "n": rng.randint(1, 9),
    }
    if rng.random() < cfg.cue_rate:
        cue = rng.choice(cue_list(action, cfg.cue_words))
        text = rng.choice(STEP_TEMPLATES).format(cue=cue, **fields)
    else:
        text = rng.choice(PLAIN_TEMPLATES).format(**fields)
    if story:
        text = f"{rng.choice(STORY_PHRASES)} {text}"
    img = render(spec, cfg.image_size, rng)
    if action:
        img = _in_progress(img, spec, bg, rng, cfg.state_look == "half")  # type: ignore[arg-type]
    relations = [name for name, on in zip(RELATIONS, (not action, action, story), strict=True) if on]
    name = doc_id(cfg, index)
    record = {
        "doc_id": name,
        "sentences": [text],
        "images": [f"images/{name}.png"],
        "links": [[0, 0]],
        "metadata": {"relations": ",".join(relations), "object": f"{spec.colour} {spec.shape}"},
    }
    if split is not None:
        record["split"] = split
    return record, img


def corpus_relations(cfg: CoherenceSynthConfig) -> tuple[str, ...]:
    """The relation vocabulary of the corpus ``cfg`` describes."""
    return GRADED_RELATIONS if cfg.salience == "graded" else RELATIONS


def write_coherence_corpus(
    out: str | Path, cfg: CoherenceSynthConfig, progress: Callable[[int], None] | None = None
) -> Path:
    """Write the corpus under ``out``; returns the path of ``documents.jsonl``."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "corpus.json").unlink(missing_ok=True)  # written last: marks a complete corpus
    docs_path = out / "documents.jsonl"
    splits = cfg.assigned_splits()
    with docs_path.open("w") as fh:
        for i in range(cfg.pairs):
            record, img = generate_pair(
                cfg, i, None if splits is None else splits.get(doc_id(cfg, i), "train")
            )
            img.save(out / record["images"][0], format="PNG", optimize=False)
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            if progress:
                progress(1)
    meta = {"format": FORMAT, "relations": list(corpus_relations(cfg)), **asdict(cfg)}
    if cfg.salience == "none":  # today's corpus.json stays as it was
        meta.pop("salience")
        meta.pop("digit_scale")
    (out / "corpus.json").write_text(json.dumps(meta, indent=2))
    return docs_path
