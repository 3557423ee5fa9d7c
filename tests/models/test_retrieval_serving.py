"""The registered retrieval pyfunc (models/retrieval_serving.py) and its gated promotion
(models/registry.py), on tiny untrained CMCM models logged to a SQLite MLflow store (no Ray:
the train -> register -> promote path through Ray and the CLI is the slow test of
test_retrieval_objectives.py)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from models.gate import Gate
from models.registry import CANDIDATE, PRODUCTION, check_gate, promote, rollback
from models.retrieval_serving import evaluate_retrieval, log_retrieval_model
from schemas.document import SCHEMA_VERSION
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from tests.conftest import tracking_uri
from tests.training.retrieval.test_retrieval_objectives import EXTRACTOR, VOCAB, WORDS, write_pair_dataset
from training.ranking import retrieval_metrics
from training.retrieval.model import RetrievalConfig
from training.retrieval.objective import build
from training.retrieval.pairs import split_pairs
from training.text import Vocabulary


def write_checkpoint(folder: Path, seed: int, relations=VOCAB, image_dim: int = 6) -> Vocabulary:
    torch.manual_seed(seed)
    vocab = Vocabulary(["<pad>", "<unk>", *WORDS])
    cfg = RetrievalConfig(
        vocab_size=len(vocab),
        word_dim=8,
        image_dim=image_dim,
        hidden=8,
        d_shared=10,
        relations=tuple(relations),
    )
    net = build(cfg.to_dict())
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": net.state_dict(), "epoch": 0, "val_loss": 0.0, "best_epoch": 0}, folder / "state.pt")
    (folder / "meta.json").write_text(json.dumps({"model": cfg.to_dict(), "train": {"max_tokens": 20}}))
    return vocab


def register(
    uri: str,
    tmp: Path,
    data: Path,
    seed: int,
    objective: str = "cmcm",
    refine=None,
    name: str = "coh",
    image_dim: int = 6,
    extractor: tuple[str, str] = EXTRACTOR[:2],
) -> str:
    """A tiny untrained model registered as ``name``'s candidate, packaged with ``extractor``
    (name, weights version) and the test split's images as its gallery."""
    vocab = write_checkpoint(tmp / f"ckpt{seed}", seed, VOCAB if objective != "cmca" else (), image_dim)
    ids, _, feats = split_pairs(Manifest.read(data).shard_paths(data, "test"))
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("coherence-tests")  # not an id left active by an earlier test's store
    with mlflow.start_run():
        mlflow.log_params(
            {
                "objective": objective,
                "schema_version": SCHEMA_VERSION,
                "feature_extractor": f"{EXTRACTOR[0]}@{EXTRACTOR[1]}",
            }
        )
        model_uri = log_retrieval_model(
            str(tmp / f"ckpt{seed}"),
            vocab,
            ids,
            feats,
            refine or {"refine_lambda": 0.5, "refine_threshold": 0.3},
            *extractor,
        )
    version = mlflow.register_model(model_uri, name).version
    MlflowClient(uri).set_registered_model_alias(name, CANDIDATE, version)
    return str(version)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retrieval-serving")
    data = write_pair_dataset(tmp / "ds")
    uri = tracking_uri(tmp)
    version = register(uri, tmp, data, seed=0)
    return tmp, data, uri, version


def test_gate_direction_lower_medr_is_better():
    prod = {"medr": 10.0, "r10": 50.0}
    assert check_gate({"medr": 8.0, "r10": 55.0}, prod, Gate()) == []
    worse = check_gate({"medr": 12.0, "r10": 50.0}, prod, Gate())
    assert len(worse) == 1 and "medr 12.0" in worse[0] and "lower is better" in worse[0]
    assert "r10" in check_gate({"medr": 9.0, "r10": 40.0}, prod, Gate())[0]
    assert check_gate({"medr": 11.0, "r10": 50.0}, prod, Gate(max_medr_rise=1.0)) == []
    assert check_gate({"medr": 10.0, "r10": 50.0}, prod, Gate(max_medr_rise=-1.0))  # must beat by 1
    assert check_gate({"medr": 30.0, "r10": 5.0}, None, Gate(max_medr=20.0))  # the ceiling alone
    assert check_gate({"medr": 30.0, "r10": 5.0}, None, Gate()) == []
    assert "not a finite" in check_gate({"medr": float("nan"), "r10": 1.0}, prod, Gate())[0]


def test_pyfunc_ranks_the_gallery_or_given_candidates(store):
    _, data, uri, version = store
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/coh/{version}")
    impl = model.unwrap_python_model()
    ids, texts, feats = split_pairs(Manifest.read(data).shard_paths(data, "test"))
    out = model.predict(__import__("pandas").DataFrame([{"text": texts[0]}]), params={"top_k": 3})
    row = out.iloc[0]
    assert len(row["candidates"]) == 3 and set(row["candidates"]) <= set(ids)  # the packaged gallery
    assert list(row["scores"]) == sorted(row["scores"], reverse=True)
    assert np.asarray(row["relation_probs"]).shape == (3, len(VOCAB))
    # given candidates, unrefined: the plain cosine ranking (brute force)
    names = [f"img{i}" for i in range(5)]
    req = __import__("pandas").DataFrame(
        [{"text": texts[1], "image_features": feats[:5].tolist(), "candidate_ids": names}]
    )
    got = model.predict(req, params={"top_k": 0, "refine": False}).iloc[0]
    cos = (impl.encode_texts([texts[1]]) @ impl.encode_images(feats[:5]).T)[0].numpy()
    assert list(got["candidates"]) == [names[i] for i in np.argsort(-cos, kind="stable")]
    np.testing.assert_allclose(got["scores"], np.sort(cos)[::-1], rtol=1e-5)
    bad = req.assign(image_features=[feats[:5, :4].tolist()])
    with pytest.raises(MlflowException, match="6 numbers"):
        model.predict(bad)


def test_evaluation_matches_the_metrics_on_the_cosine_matrix(store):
    _, data, uri, version = store
    mlflow.set_tracking_uri(uri)
    impl = mlflow.pyfunc.load_model(f"models:/coh/{version}").unwrap_python_model()
    paths = Manifest.read(data).shard_paths(data, "val")
    got = evaluate_retrieval(impl, paths, refine=False)
    _, texts, feats = split_pairs(paths)
    theta = (impl.encode_texts(texts) @ impl.encode_images(feats).T).numpy()
    want = retrieval_metrics(theta, pool_size=500, n_pools=10)["t2i"]
    assert got["pairs"] == 14 and got["medr"] == want["medr"] and got["r10"] == want["r10"]


def test_promotion_gates_on_validation_medr_and_rolls_back(store):
    tmp, data, uri, v1 = store
    client = MlflowClient(uri)
    first = promote(client, "coh", data, Gate())
    assert first.promoted and set(first.candidate_metrics) >= {"medr", "r10", "pairs"}
    assert first.candidate_metrics["pairs"] == 14  # the val split: retrieval gates on validation
    tag = json.loads(client.get_model_version("coh", v1).tags["mmlinks.promotion_check"])
    assert tag["split"] == "val"
    v2 = register(uri, tmp, data, seed=0)  # the same weights: equal MedR
    refused = promote(client, "coh", data, Gate(max_medr_rise=-1.0))
    assert not refused.promoted and "medr" in refused.failures[0]
    assert str(client.get_model_version_by_alias("coh", PRODUCTION).version) == v1
    assert promote(client, "coh", data, Gate()).promoted
    assert str(client.get_model_version_by_alias("coh", PRODUCTION).version) == v2
    assert rollback(client, "coh") == (v2, v1)
    # a linking-family candidate is not compared with a retrieval production
    register(uri, tmp, data, seed=1, objective="ap")
    with pytest.raises(MmlinksError, match="cannot be compared"):
        promote(client, "coh", data, Gate())


def test_evaluate_command_compares_two_models_in_the_report(store, capfd):
    """`mmlinks evaluate` on a CMCM model with a CMCA model beside it: the paper's metrics per
    model and relation, the per-query file, and the Figure 6 cards in the HTML report."""
    from cli.main import main

    tmp, data, uri, version = store
    register(uri, tmp, data, seed=2, objective="cmca", name="coh-cmca")
    report, per_query = tmp / "report.html", tmp / "queries.jsonl"
    argv = ["evaluate", "--data", str(data), "--model-uri", f"models:/coh/{version}", "--workdir", str(tmp)]
    argv += ["--compare-uri", "models:/coh-cmca@candidate", "--report", str(report), "--per-doc-out"]
    capfd.readouterr()
    assert main([*argv, str(per_query), "--json"]) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["family"] == "retrieval" and set(out["models"]) == {"coh/1", "coh-cmca@candidate"}
    cmcm, cmca = out["models"]["coh/1"], out["models"]["coh-cmca@candidate"]
    assert set(cmcm["relations"]) == set(VOCAB) and set(cmcm["relation_ap"]) == set(VOCAB)
    assert "t2i_refined" in cmcm and "relation_ap" not in cmca
    rows = [json.loads(line) for line in per_query.read_text().splitlines()]
    assert len(rows) == 2 * 18 and all(1 <= r["rank"] <= 18 and len(r["top5"]) == 5 for r in rows)
    page = report.read_text()
    assert page.count("<section class=card>") == 6 and "coh-cmca@candidate (rank" in page


def test_promote_names_the_model_by_the_objective_without_a_flag(store, capfd):
    """`mmlinks promote --data PAIRS` finds the model `mmlinks train --objective cmcm` registered
    (training.objectives.registry.default_model_name); several candidates need --objective."""
    from cli.main import main
    from models.registry import default_names
    from training.objectives.registry import default_model_name

    assert default_model_name("cmcm") == "mmlinks-cmcm"
    assert default_model_name("cmcm-c", "Story") == "mmlinks-cmcm-c-Story"
    tmp, data, uri, _ = store
    manifest = Manifest.read(data)
    assert "mmlinks-ap" not in default_names(manifest) and "mmlinks-cmcm-c-Action" in default_names(manifest)

    def promote_cli(*flags: str) -> tuple[int, dict]:
        capfd.readouterr()
        rc = main(["promote", "--data", str(data), "--workdir", str(tmp), *flags, "--json"])
        return rc, json.loads(capfd.readouterr().out or "{}")

    cmcm = register(uri, tmp, data, seed=0, objective="cmcm", name="mmlinks-cmcm")
    rc, out = promote_cli()
    assert rc == 0 and out["name"] == "mmlinks-cmcm" and out["candidate_version"] == cmcm, out
    register(uri, tmp, data, seed=0, objective="cmcm", name="mmlinks-cmcm")
    register(uri, tmp, data, seed=2, objective="cmca", name="mmlinks-cmca")
    capfd.readouterr()
    assert main(["promote", "--data", str(data), "--workdir", str(tmp)]) == 2
    err = capfd.readouterr().err
    assert "several models have a 'candidate' version (mmlinks-cmca, mmlinks-cmcm)" in err
    rc, out = promote_cli("--objective", "cmca")
    assert rc == 0 and out["name"] == "mmlinks-cmca" and out["promoted"]
    assert main(["promote", "--data", str(data), "--workdir", str(tmp), "--relation", "Story"]) == 2
    assert "--relation needs --objective cmcm-c" in capfd.readouterr().err


def test_pyfunc_ranks_raw_candidate_images_through_the_recorded_extractor(store):
    """Candidates as base64 images or data: URIs: the recorded extractor (EfficientNet-Lite0 here)
    gives the same ranking as its features sent as image_features; a width or weights mismatch,
    an unreadable image and both kinds at once are 400-style errors."""
    import base64

    import pandas as pd

    from features import get_extractor
    from features.images import decode
    from tests.fixtures.images import noise_png

    tmp, data, uri, _ = store
    lite0 = get_extractor("efficientnet-lite0")
    pngs = [noise_png(seed) for seed in range(3)]
    images = [base64.b64encode(b).decode() for b in pngs[:2]]
    images.append("data:image/png;base64," + base64.b64encode(pngs[2]).decode())
    net = lite0.load_model()
    feats = [
        lite0.postprocess(o).features for o in lite0.forward(net, [lite0.preprocess(decode(b)) for b in pngs])
    ]
    version = register(
        uri, tmp, data, seed=4, name="coh-raw", image_dim=len(feats[0]), extractor=(lite0.name, lite0.version)
    )
    model = mlflow.pyfunc.load_model(f"models:/coh-raw/{version}")
    names = ["a", "b", "c"]
    params = {"top_k": 0, "refine": False}
    got = model.predict(
        pd.DataFrame([{"text": "a red circle", "images": images, "candidate_ids": names}]), params=params
    )
    want = model.predict(
        pd.DataFrame(
            [{"text": "a red circle", "image_features": np.asarray(feats).tolist(), "candidate_ids": names}]
        ),
        params=params,
    )
    assert list(got.iloc[0]["candidates"]) == list(want.iloc[0]["candidates"])
    np.testing.assert_allclose(got.iloc[0]["scores"], want.iloc[0]["scores"], rtol=1e-4, atol=1e-5)
    with pytest.raises(MlflowException, match="query 0: image 1 is not a readable image"):
        model.predict(pd.DataFrame([{"text": "x", "images": [images[0], "bm90IGFuIGltYWdl"]}]))
    with pytest.raises(MlflowException, match="not both"):
        model.predict(
            pd.DataFrame([{"text": "x", "images": images, "image_features": np.asarray(feats).tolist()}])
        )
    # the 6-d model of the store: Lite0's features do not fit its image tower
    small = mlflow.pyfunc.load_model(f"models:/coh/{store[3]}")
    with pytest.raises(MlflowException, match="gives 1280-d features, this model takes 6-d"):
        small.predict(pd.DataFrame([{"text": "x", "images": images[:1]}]))
    # other weights than this machine's: refused before any image is decoded
    other = register(
        uri,
        tmp,
        data,
        seed=5,
        name="coh-other",
        image_dim=len(feats[0]),
        extractor=(lite0.name, "other-weights"),
    )
    with pytest.raises(MlflowException, match="trained on efficientnet-lite0@other-weights"):
        mlflow.pyfunc.load_model(f"models:/coh-other/{other}").predict(
            pd.DataFrame([{"text": "x", "images": images[:1]}])
        )


def _bank_checkpoint(folder: Path, trained_on: str) -> Vocabulary:
    """An untrained training checkpoint of a model with a 8-caption bank (still empty), as the
    loop writes it, naming ``trained_on`` as its training data; vocab.json beside state.pt."""
    torch.manual_seed(5)
    vocab = Vocabulary(["<pad>", "<unk>", *WORDS])
    cfg = RetrievalConfig(
        vocab_size=len(vocab),
        word_dim=8,
        image_dim=6,
        hidden=8,
        d_shared=10,
        query_bank=8,
        bank_temperature=0.02,
    )
    folder.mkdir()
    torch.save(
        {"model": build(cfg.to_dict()).state_dict(), "epoch": 0, "val_loss": 0.0, "best_epoch": 0},
        folder / "state.pt",
    )
    meta = {"model": cfg.to_dict(), "train": {"max_tokens": 20, "data": trained_on}}
    (folder / "meta.json").write_text(json.dumps(meta))
    vocab.save(folder / "vocab.json")
    return vocab


def _test_ranks(net, vocab, data: Path, bank: torch.Tensor | None) -> list[int]:
    """Each test caption's rank of its own image among the test images, by brute force: the
    cosine, less the bank's term per image where ``bank`` is given (temperature 0.02)."""
    from training.retrieval.query_bank import encode_captions

    _, texts, feats = split_pairs(Manifest.read(data).shard_paths(data, "test"))
    s = encode_captions(net, vocab, 20, texts)
    with torch.no_grad():
        v = net.image(torch.as_tensor(feats, dtype=torch.float32))
    m = (s @ v.T).numpy()
    if bank is not None:
        m = m - (0.02 * torch.log(torch.exp(bank @ v.T / 0.02).mean(0))).numpy()[None, :]
    return sorted(int((m[i] >= m[i, i]).sum()) for i in range(len(m)))


def test_evaluating_a_training_checkpoint_draws_its_query_bank(store, tmp_path, capfd):
    """A training checkpoint (its bank still empty) is scored as ``finish_run`` scores the run:
    with the bank drawn from its training dataset's captions (ranks against brute force)."""
    from cli.main import main
    from training.checkpoints import load_checkpoint_model
    from training.retrieval.query_bank import bank_captions, encode_captions

    _, data, _, _ = store
    ckpt = tmp_path / "ckpt"
    vocab = _bank_checkpoint(ckpt, str(data))
    per_doc = tmp_path / "q.jsonl"
    capfd.readouterr()
    argv = ["evaluate", "--data", str(data), "--checkpoint", str(ckpt), "--workdir", str(tmp_path)]
    assert main([*argv, "--per-doc-out", str(per_doc), "--json"]) == 0
    got = sorted(json.loads(line)["rank"] for line in per_doc.read_text().splitlines())
    net = load_checkpoint_model(ckpt)[0]
    bank = encode_captions(net, vocab, 20, bank_captions(data, Manifest.read(data), 8))
    assert len(bank) == 8
    assert _test_ranks(net, vocab, data, bank) != _test_ranks(net, vocab, data, None)  # the bank matters
    assert got == _test_ranks(net, vocab, data, bank)
    assert "no training captions" not in capfd.readouterr().err


def test_a_checkpoint_without_training_captions_ranks_by_the_cosine_and_says_so(store, tmp_path, capfd):
    """Its training data gone and ``--data`` without a train split: no bank to draw, so the plain
    cosine ranks (brute force), and a note on stderr says why."""
    import dataclasses
    import shutil

    from cli.main import main
    from training.checkpoints import load_checkpoint_model

    _, data, _, _ = store
    held = tmp_path / "test-only"
    manifest = Manifest.read(data)
    kept = [s for s in manifest.shards if s.split != "train"]
    for shard in kept:
        (held / shard.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / shard.path, held / shard.path)
    dataclasses.replace(manifest, shards=kept).write(held)
    ckpt = tmp_path / "ckpt"
    vocab = _bank_checkpoint(ckpt, str(tmp_path / "gone"))
    per_doc = tmp_path / "q.jsonl"
    capfd.readouterr()
    argv = ["evaluate", "--data", str(held), "--checkpoint", str(ckpt), "--workdir", str(tmp_path)]
    assert main([*argv, "--per-doc-out", str(per_doc), "--json"]) == 0
    got = sorted(json.loads(line)["rank"] for line in per_doc.read_text().splitlines())
    assert got == _test_ranks(load_checkpoint_model(ckpt)[0], vocab, held, None)
    err = capfd.readouterr().err
    assert f"note: {held} has no training captions for the query bank: plain cosine" in err
