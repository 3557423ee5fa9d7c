"""A feature-level image confound: give every image of a document its document's look
(``mmlinks data confound``, issue #33; docs/training.md has the ratios it gives).

Why feature space: pixel corpora leave the image ratio at 2-5 where real posts reach 10-22. A
look is a crop of a scikit-image photo through the dataset's own extractor, mixed as
``(1 - weight) * v + weight * look``; the result is a new dataset, the source untouched."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from schemas.errors import MmlinksError
from schemas.manifest import Manifest, ShardInfo
from schemas.shards import read_documents, shard_bytes

# Real photographs shipped inside the scikit-image package (no download): the looks are crops.
LOOK_PHOTOS = (
    "astronaut.png",
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "brick.png",
    "grass.png",
    "gravel.png",
    "coins.png",
    "camera.png",
    "moon.png",
    "color.png",
    "ihc.png",
    "horse.png",
    "cell.png",
    "page.png",
)


def look_photos() -> list[Image.Image]:
    """The shipped photos as RGB images (a clear error if scikit-image lacks them)."""
    import skimage

    folder = Path(skimage.__file__).parent / "data"
    try:
        return [Image.open(folder / name).convert("RGB") for name in LOOK_PHOTOS]
    except OSError as exc:
        raise MmlinksError(f"the look photos of scikit-image are missing under {folder}: {exc}") from exc


def look_image(photos: list[Image.Image], key: str, size: int = 224) -> Image.Image:
    """The look of document ``key``: a crop of one photo (a quarter to 70 % of its short side),
    maybe mirrored; depends only on ``key``."""
    rng = random.Random(f"look:{key}")
    photo = photos[rng.randrange(len(photos))]
    w, h = photo.size
    side = int(min(w, h) * rng.uniform(0.25, 0.7))
    x0, y0 = rng.randint(0, w - side), rng.randint(0, h - side)
    crop = photo.crop((x0, y0, x0 + side, y0 + side)).resize((size, size), Image.BILINEAR)
    return crop.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop


def blend_look(
    source: str | Path,
    out: str | Path,
    weight: float,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Manifest:
    """Write ``out``: the dataset at ``source`` with every image vector blended towards its
    document's look by ``weight`` in [0, 1). Returns the new manifest."""
    from features.base import get_extractor

    if not 0 <= weight < 1:
        raise MmlinksError(f"--image-look must be in [0, 1), got {weight}")
    source, out = Path(source), Path(out)
    if out.resolve() == source.resolve():
        raise MmlinksError("--out must be a new directory, not the source dataset")
    if (out / "manifest.json").exists():
        raise MmlinksError(f"{out} already holds a dataset; choose another --out")
    manifest = Manifest.read(source)
    info = manifest.feature_extractor
    extractor = get_extractor(info.name, **manifest.build_params.get("extractor_options", {}))
    if extractor.version != info.version:
        raise MmlinksError(
            f"the dataset's features are {info.name}@{info.version}; this machine's extractor is "
            f"@{extractor.version}, so its looks would not be in the same space"
        )
    model = extractor.load_model()
    photos = look_photos()

    params = {
        **manifest.build_params,
        "image_look": {"from": manifest.dataset_version, "weight": weight, "seed": seed},
    }
    shards: list[tuple[ShardInfo, bytes]] = []
    for shard in manifest.shards:
        docs = read_documents([source / shard.path])
        looks = extractor.extract([look_image(photos, f"{seed}:{d.doc_id}") for d in docs], model=model)
        for doc, look in zip(docs, looks, strict=True):
            lv = np.asarray(look.features, dtype=np.float64)
            for im in doc.images:
                if im.features is not None:
                    v = (1 - weight) * np.asarray(im.features, dtype=np.float64) + weight * lv
                    im.features = v.astype(np.float32).tolist()
            if progress:
                progress(1)
        data = shard_bytes(docs, manifest.feature_dtype)
        name = shard.path.rsplit("/", 1)[-1]
        info_ = ShardInfo(
            path=name,
            split=shard.split,
            rows=len(docs),
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        shards.append((info_, data))
    version = Manifest.version_id([s for s, _ in shards], params)
    folder = out / "versions" / version
    folder.mkdir(parents=True, exist_ok=True)
    for s, data in shards:
        (folder / s.path).write_bytes(data)
    dead = None
    if manifest.dead_letter and (source / manifest.dead_letter).exists():
        shutil.copyfile(source / manifest.dead_letter, folder / "dead_letter.jsonl")
        dead = f"versions/{version}/dead_letter.jsonl"
    new = replace(
        manifest,
        dataset_version=version,
        build_params=params,
        shards=[replace(s, path=f"versions/{version}/{s.path}") for s, _ in shards],
        dead_letter=dead,
    )
    (folder / "manifest.json").write_text(new.to_json())
    new.write(out)  # last: its presence marks a complete dataset
    return new


def describe(manifest: Manifest) -> str:
    look = manifest.build_params.get("image_look")
    return json.dumps(look) if look else "none"
