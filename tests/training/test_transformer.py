"""The Li et al. 2021 Transformer backbone and the region tensors it reads (training/regions.py)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from schemas.document import Document, ImageRecord, RegionFeatures
from schemas.shards import read_table, write_shard
from training.backbone import build_model
from training.data import DocBatch, features_of
from training.link.transformer import TransformerConfig, TransformerLink
from training.regions import RegionBatch, region_dim, regions_of
from training.text import Vocabulary, concept_words

VOCAB = Vocabulary(["<pad>", "<unk>", "tiger", "cat", "dog", "red", "circle", "a", "the", "kite"])
LABELS = ["tiger cat", "dog", "kite", "red circle", "tiger", "cat"]


def tiny_cfg(**kw) -> TransformerConfig:
    base = dict(
        vocab_size=len(VOCAB),
        word_dim=8,
        image_dim=6,
        region_dim=5,
        d_multi=16,
        layers=2,
        heads=2,
        max_tokens=10,
        max_regions=4,
        dropout=0.1,
    )
    base.update(kw)
    return TransformerConfig(**base)


def tiny_batch(seed: int = 0, n_sent=(3, 2), n_img=(2, 3), no_regions: int | None = None) -> DocBatch:
    g = torch.Generator().manual_seed(seed)
    N, R = sum(n_img), 4
    lengths = torch.randint(1, 8, (sum(n_sent),), generator=g)
    tokens = torch.randint(1, len(VOCAB), (len(lengths), int(lengths.max())), generator=g)
    tokens[torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]] = 0
    counts = torch.randint(1, R + 1, (N,), generator=g)
    if no_regions is not None:
        counts[no_regions] = 0
    mask = torch.arange(R)[None, :] < counts[:, None]
    words = torch.randint(1, len(VOCAB), (N, R, 2), generator=g) * mask[..., None]
    regions = RegionBatch(torch.randn(N, R, 5, generator=g) * mask[..., None], words, mask)
    return DocBatch(
        doc_ids=[f"d{i}" for i in range(len(n_sent))],
        tokens=tokens,
        lengths=lengths,
        features=torch.randn(N, 6, generator=g),
        n_sentences=list(n_sent),
        n_images=list(n_img),
        links=[None] * len(n_sent),
        regions=regions,
    )


def trained_a_little(model: TransformerLink) -> TransformerLink:
    """A few steps so running statistics and weights are not at their initial values."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for seed in range(3):
        s, v = model(tiny_batch(seed))  # forward and encode are the same
        loss = -(s[:2] @ v[:2].T).trace()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


# ---------------------------------------------------------------- encoder


def test_encode_shapes_unit_norm_and_gradients():
    model = TransformerLink(tiny_cfg(), embeddings=np.random.default_rng(0).normal(size=(len(VOCAB), 8)))
    batch = tiny_batch(no_regions=1)
    s, v = model.encode(batch)
    assert s.shape == (5, 16) and v.shape == (5, 16)
    assert torch.allclose(s.norm(dim=-1), torch.ones(5), atol=1e-5)
    assert torch.allclose(v.norm(dim=-1), torch.ones(5), atol=1e-5)
    (s @ v.T).sum().backward()
    for name in ("embed.weight", "pos.weight", "w_t.weight", "w_v.weight", "w_g.weight", "segment.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


def test_pooled_vectors_are_centred_so_training_starts_from_spread_out_vectors():
    """Without ``pool_norm`` the mean-pooled outputs of unrelated inputs start nearly parallel
    (constant segment embeddings dominate); with it they start spread out."""
    batch = tiny_batch(seed=3, n_sent=(6, 6), n_img=(6, 6))
    spread = {}
    for pool_norm in (False, True):
        torch.manual_seed(0)
        _, v = TransformerLink(tiny_cfg(pool_norm=pool_norm)).train().encode(batch)
        cos = v @ v.T
        spread[pool_norm] = float(cos[~torch.eye(len(cos), dtype=torch.bool)].mean())
    assert spread[False] > 0.5 and abs(spread[True]) < 0.2


def test_pretrained_embeddings_are_copied_and_shared_with_concepts():
    emb = np.random.default_rng(1).normal(size=(len(VOCAB), 8)).astype(np.float32)
    model = TransformerLink(tiny_cfg(), embeddings=emb)
    assert np.allclose(model.embed.weight.detach().numpy(), emb)
    model.eval()
    batch = tiny_batch()
    _, v = model.encode(batch)
    with torch.no_grad():
        model.embed.weight[2:] += 1.0  # word embeddings move -> concept tokens move
    _, v2 = model.encode(batch)
    assert not torch.allclose(v, v2)


def test_padding_does_not_change_outputs_in_eval_mode():
    model = trained_a_little(TransformerLink(tiny_cfg()))
    batch = tiny_batch(seed=4, no_regions=2)
    s, v = model.encode(batch)
    extra = 3  # padded token columns and padded regions full of garbage
    b2 = tiny_batch(seed=4, no_regions=2)
    b2.tokens = torch.cat([b2.tokens, torch.zeros(len(b2.tokens), extra, dtype=torch.long)], 1)
    r = b2.regions
    N, _, D = r.features.shape
    b2.regions = RegionBatch(
        torch.cat([r.features, 100 * torch.randn(N, extra, D)], 1),
        torch.cat([r.tokens, torch.randint(1, len(VOCAB), (N, extra, r.tokens.shape[2]))], 1),
        torch.cat([r.mask, torch.zeros(N, extra, dtype=torch.bool)], 1),
    )
    s2, v2 = model.encode(b2)
    assert torch.allclose(s, s2, atol=1e-5) and torch.allclose(v, v2, atol=1e-5)


def test_outputs_do_not_depend_on_the_other_documents_in_eval_mode():
    model = trained_a_little(TransformerLink(tiny_cfg()))
    batch = tiny_batch(seed=5)
    _, v = model.encode(batch)
    r = batch.regions
    alone = model.encode_images(batch.features[3:4], RegionBatch(r.features[3:4], r.tokens[3:4], r.mask[3:4]))
    assert torch.allclose(v[3:4], alone, atol=1e-5)


def test_global_feature_is_the_fallback_for_images_without_regions():
    model = trained_a_little(TransformerLink(tiny_cfg()))
    batch = tiny_batch(seed=6, no_regions=0)
    _, v = model.encode(batch)
    assert torch.isfinite(v).all()
    batch.features = batch.features + 1.0
    _, v2 = model.encode(batch)
    assert not torch.allclose(v[0], v2[0])  # no regions: the global feature is the image
    assert torch.allclose(v[1:], v2[1:], atol=1e-6)  # with regions: the global token is unused
    always = trained_a_little(TransformerLink(tiny_cfg(global_token=True)))
    a, b = always.encode(tiny_batch(seed=6))[1], None
    shifted = tiny_batch(seed=6)
    shifted.features = shifted.features + 1.0
    b = always.encode(shifted)[1]
    assert not torch.allclose(a[1:], b[1:])


def test_training_mode_handles_a_single_region_and_a_region_less_batch():
    model = TransformerLink(tiny_cfg()).train()
    batch = tiny_batch(n_sent=(1, 1), n_img=(1, 1))
    batch.regions.mask[:] = False
    batch.regions.mask[0, 0] = True
    assert torch.isfinite(model.encode(batch)[1]).all()
    empty = tiny_batch()
    N = empty.features.shape[0]
    empty.regions = RegionBatch(
        torch.zeros(N, 0, 0), torch.zeros(N, 0, 4, dtype=torch.long), torch.zeros(N, 0, dtype=bool)
    )
    assert torch.isfinite(model.encode(empty)[1]).all()


def test_build_model_dispatch_and_state_round_trip():
    cfg = tiny_cfg()
    stats = (np.full(6, 2.0, np.float32), np.full(6, 3.0, np.float32))
    model = build_model(cfg.to_dict(), None, stats)
    assert isinstance(model, TransformerLink) and float(model.feature_std[0]) == 3.0
    trained_a_little(model)
    copy = build_model(cfg.to_dict())
    copy.load_state_dict(model.state_dict())
    copy.eval()
    batch = tiny_batch(seed=8)
    for a, b in zip(model.encode(batch), copy.encode(batch), strict=True):
        assert torch.allclose(a, b)
    with torch.no_grad():
        s = model.encode_text(batch.tokens[:3], batch.lengths[:3])
        v = model.encode_images(batch.features[:2], _first(batch.regions, 2))
    assert (s @ v.T).shape == (3, 2)


def test_missing_regions_is_a_clear_error():
    batch = tiny_batch()
    batch.regions = None
    with pytest.raises(ValueError, match="regions=True"):
        TransformerLink(tiny_cfg()).encode(batch)


def _first(r: RegionBatch, n: int) -> RegionBatch:
    return RegionBatch(r.features[:n], r.tokens[:n], r.mask[:n])


# ---------------------------------------------------------------- regions from shards


def _image(doc: int, k: int, n_regions: int | None, scores=True, dim: int = 3) -> ImageRecord:
    """Image k of document doc; its global feature and every region vector encode (doc, k)."""
    tag = 10.0 * doc + k
    regions = None
    if n_regions is not None:
        regions = RegionFeatures(
            boxes=[[0, 0, 1, 1]] * n_regions,
            vectors=[[tag, r, 0.5][:dim] + [0.0] * (dim - 3) for r in range(n_regions)],
            labels=[LABELS[(doc + k + r) % len(LABELS)] for r in range(n_regions)],
            scores=[float((r * 7) % 5) for r in range(n_regions)] if scores else None,
        )
    return ImageRecord(f"c{doc}-{k}", "u", 8, 8, 0, [tag, 1.0], regions)


def write_region_shard(path, with_regions: bool = True, dtype: str = "float32"):
    docs = []
    for d, n_imgs in enumerate([3, 1, 4]):
        images = []
        for k in range(n_imgs):
            n_reg = None if (not with_regions or (d, k) == (2, 1)) else 2 + (d + k) % 5
            images.append(_image(d, k, n_reg, scores=(d, k) != (0, 2)))
        docs.append(Document(f"doc{d}", "synthetic", "train", ["a red circle"], images, [(0, 0)]))
    write_shard(path, docs, dtype)
    return docs


def _expected_order(img: ImageRecord, max_regions: int) -> list[int]:
    """Top regions by score, ties (and missing scores) in shard order."""
    n = len(img.regions.vectors)
    scores = img.regions.scores or [0.0] * n
    return sorted(range(n), key=lambda r: (-scores[r], r))[:max_regions]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_regions_of_follows_the_batch_image_order_and_scores(tmp_path, dtype):
    docs = write_region_shard(tmp_path / "s.parquet", dtype=dtype)
    table = read_table([tmp_path / "s.parquet"])
    rng = np.random.default_rng(0)
    perms = [rng.permutation(len(d.images)) for d in docs]
    rb = regions_of(table, perms, VOCAB, max_regions=4)
    feats, _ = features_of(table)
    globals_in_batch_order = np.concatenate([f[p] for f, p in zip(feats, perms, strict=True)])
    assert rb.features.dtype == torch.float32 and rb.features.shape == (8, 4, 3)
    assert rb.tokens.shape == (8, 4, 4) and rb.mask.shape == (8, 4)
    pos = 0
    for d, doc in enumerate(docs):
        for j in perms[d]:
            img = doc.images[j]
            assert rb.features[pos, 0, 0] == globals_in_batch_order[pos, 0] or img.regions is None
            if img.regions is None:
                assert not rb.mask[pos].any() and rb.features[pos].abs().sum() == 0
            else:
                order = _expected_order(img, 4)
                assert rb.mask[pos].tolist() == [r < len(order) for r in range(4)]
                for slot, r in enumerate(order):
                    assert rb.features[pos, slot].tolist() == pytest.approx(img.regions.vectors[r])
                    want = VOCAB.encode(img.regions.labels[r], 4)
                    assert rb.tokens[pos, slot].tolist() == want + [0] * (4 - len(want))
            pos += 1


def test_regions_of_without_perms_and_a_region_less_shard(tmp_path):
    write_region_shard(tmp_path / "none.parquet", with_regions=False)
    rb = regions_of(read_table([tmp_path / "none.parquet"]), None, VOCAB, max_regions=36)
    assert rb.mask.shape == (8, 0) and rb.features.shape == (8, 0, 0)
    assert region_dim([str(tmp_path / "none.parquet")]) is None
    assert list(concept_words([str(tmp_path / "none.parquet")])) == []


def test_regions_of_a_table_without_a_regions_column():
    """Served documents carry global features only; every image then has no region."""
    import pyarrow as pa

    images = [{"features": [1.0, 2.0], "regions": None}, {"features": [3.0, 4.0], "regions": None}]
    table = pa.table({"doc_id": ["input"], "sentences": [["a red circle"]], "images": [images]})
    rb = regions_of(table, [np.array([1, 0])], VOCAB, max_regions=36)
    assert rb.features.shape == (2, 0, 0) and rb.tokens.shape == (2, 0, 4) and rb.mask.shape == (2, 0)
    no_field = table.set_column(2, "images", pa.array([[{"features": [1.0]}]]))
    assert regions_of(no_field, None, VOCAB, 36).mask.shape == (1, 0)


def test_concept_words_and_region_dim(tmp_path):
    docs = write_region_shard(tmp_path / "s.parquet")
    paths = [str(tmp_path / "s.parquet")]
    assert region_dim(paths) == 3
    want = sorted(lab for d in docs for im in d.images if im.regions for lab in im.regions.labels)
    assert sorted(concept_words(paths)) == want
    vocab = Vocabulary.build(["a red circle", *concept_words(paths)], min_count=1)
    assert {"tiger", "cat", "dog", "kite"} <= set(vocab.words)


@pytest.fixture(scope="module")
def region_dataset(tmp_path_factory):
    """A tiny synthetic corpus through the real Beam build with grid-lite0 regions."""
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    root = tmp_path_factory.mktemp("region-corpus")
    write_corpus(root, SynthConfig(docs=4, seed=5, image_size=64, images_min=2, images_max=3))
    out = tmp_path_factory.mktemp("region-dataset")
    build_dataset(
        BuildConfig(
            source="synthetic",
            input=str(root),
            out=str(out),
            regions="grid-lite0",
            split_ratios={"train": 1.0},
            direct_workers=1,
            cpu_threads=1,
        )
    )
    return out


def test_regions_of_a_real_beam_build(region_dataset):
    """grid-lite0 regions from the real build: 36 cells per image, ImageNet labels as tokens."""
    from schemas.manifest import Manifest

    manifest = Manifest.read(region_dataset)
    paths = [str(p) for p in manifest.shard_paths(region_dataset, "train")]
    assert region_dim(paths) == manifest.region_extractor.dim == 1280
    words = list(concept_words(paths))
    vocab = Vocabulary.build(words, min_count=1)
    table = pq.read_table(paths[0]).slice(0, 3)
    perms = [np.arange(n)[::-1] for n in features_of(table)[1]]
    rb = regions_of(table, perms, vocab, max_regions=8)
    n_img = sum(len(p) for p in perms)
    assert rb.features.shape == (n_img, 8, 1280) and rb.mask.all()
    assert (rb.tokens[..., 0] > 1).all()  # every label word is in a vocabulary built from labels
    first = table.column("images")[0].as_py()[perms[0][0]]["regions"]
    best = int(np.argmax(first["scores"]))
    assert rb.features[0, 0].numpy() == pytest.approx(np.asarray(first["vectors"][best]), rel=1e-3)
    model = TransformerLink(
        TransformerConfig(
            len(vocab), word_dim=300, image_dim=1280, region_dim=1280, d_multi=32, layers=1, heads=4
        )
    ).eval()
    v = model.encode_images(torch.from_numpy(np.concatenate(features_of(table)[0])), rb)
    assert v.shape == (n_img, 32) and torch.isfinite(v).all()
