"""cmca / cmcm / cmcm-c in the registries and the config, and their loss and validation MedR on
a batch built the way the training loop builds it (no Ray here; the end-to-end run through
Ray Train is the slow test at the bottom)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from schemas.document import SCHEMA_VERSION, Document, ImageRecord
from schemas.errors import MmlinksError
from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo
from schemas.shards import documents_to_table, write_shard
from tests.conftest import tracking_uri
from training.config import TrainConfig
from training.data import make_batch
from training.objectives.registry import get_objective, objective_loss
from training.retrieval.losses import cmcm_loss
from training.retrieval.model import RetrievalConfig
from training.retrieval.objective import (
    build,
    cam_relations,
    evaluate_pairs,
    pair_table_labels,
    val_metrics,
)
from training.text import Vocabulary

VOCAB = ["Visible", "Action", "Story"]
WORDS = ["red", "blue", "circle", "star", "done", "painting", "yesterday"]


def pair_docs(n: int, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        action = bool(i % 2)
        rels = ["Action" if action else "Visible"] + (["Story"] if i % 3 == 0 else [])
        text = " ".join(rng.choice(WORDS, size=4))
        docs.append(
            Document(
                doc_id=f"p{i:03d}",
                source="synthetic",
                split="train",
                sentences=[text],
                images=[
                    ImageRecord(f"c{i}", f"u{i}", 8, 8, i, rng.normal(size=6).astype(np.float32).tolist())
                ],
                links=[(0, 0)],
                metadata={"relations": ",".join(rels)},
            )
        )
    return docs


EXTRACTOR = ("efficientnet-lite0", "imagenet-57934424", 6)  # 6-d features, as pair_docs


def write_pair_dataset(root: Path) -> Path:
    docs = pair_docs(40, seed=3)
    shards = []
    for split, part in (("train", docs[:8]), ("val", docs[8:22]), ("test", docs[22:])):
        for d in part:
            d.split = split
        rel = f"shards/{split}-00000.parquet"
        rows, size, sha = write_shard(root / rel, part)
        shards.append(ShardInfo(rel, split, rows, size, sha))
    counts = {"splits": {s.split: s.rows for s in shards}, "dropped": {}}
    Manifest(
        SCHEMA_VERSION,
        "pairs-v1",
        "synthetic",
        counts,
        FeatureExtractorInfo(*EXTRACTOR),
        shards,
        relations=list(VOCAB),
    ).write(root)
    return root


def test_registry_and_config_rules():
    assert get_objective("cmcm").family == "retrieval" and get_objective("ap").family == "link"
    cfg = TrainConfig(objective="cmcm")
    assert cfg.select_by == "val_medr" and cfg.model_backbone == "coherence"
    assert TrainConfig(objective="ap").select_by == "val_within"
    assert TrainConfig(objective="cmcm-c", relation="Action").label == "cmcm-c-Action"
    assert TrainConfig(objective="cmca", retrieval_pooling="mean").label == "cmca-noattn"
    assert TrainConfig(objective="cmca", retrieval_pooling="bag").label == "cmca-bag"
    for bad, match in (
        ({"objective": "cmcm-c"}, "relation"),
        ({"objective": "cmcm", "relation": "Action"}, "relation"),
        ({"objective": "ap", "select_by": "val_medr"}, "val_medr"),
        ({"objective": "cmcm", "select_by": "val_structure"}, "val_structure measures inside documents"),
        ({"objective": "news", "select_by": "val_structure"}, "val_structure measures inside documents"),
        ({"objective": "ap", "backbone": "coherence"}, "coherence trains only"),
    ):
        with pytest.raises(MmlinksError, match=match):
            TrainConfig(**bad)


def test_cam_relations_follow_the_vocabulary():
    assert cam_relations(TrainConfig(objective="cmca"), None) == []
    assert cam_relations(TrainConfig(objective="cmcm"), VOCAB) == VOCAB
    assert cam_relations(TrainConfig(objective="cmcm-c", relation="Story"), VOCAB) == ["Story"]
    with pytest.raises(MmlinksError, match="not a relation"):
        cam_relations(TrainConfig(objective="cmcm-c", relation="Meta"), VOCAB)
    with pytest.raises(MmlinksError, match="coherence-labelled pair dataset"):
        cam_relations(TrainConfig(objective="cmcm"), None)


def test_pair_labels_refuse_documents_that_are_not_pairs():
    docs = pair_docs(4)
    table = documents_to_table(docs)
    assert pair_table_labels(table, VOCAB, ["Action", "Story"]).tolist() == [[0, 1], [1, 0], [0, 0], [1, 1]]
    docs[0].sentences.append("a second sentence")
    with pytest.raises(MmlinksError, match="pair datasets"):
        pair_table_labels(documents_to_table(docs), VOCAB, VOCAB)
    docs = pair_docs(2)
    docs[1].metadata["relations"] = "Meta"
    with pytest.raises(MmlinksError, match="Meta"):
        pair_table_labels(documents_to_table(docs), VOCAB, VOCAB)


def _model_and_batch(relations, n: int = 12):
    table = documents_to_table(pair_docs(n))
    vocab = Vocabulary.build([s for d in table.column("sentences").to_pylist() for s in d], 1)
    torch.manual_seed(0)
    cfg = RetrievalConfig(
        vocab_size=len(vocab),
        word_dim=8,
        image_dim=6,
        hidden=8,
        d_shared=10,
        relations=tuple(relations),
        relation_weights=(2.0,) * len(relations),
    )
    return build(cfg.to_dict()), make_batch(table, vocab, 20)


def test_cmcm_loss_through_the_registry_matches_the_equation():
    model, batch = _model_and_batch(VOCAB)
    cfg = TrainConfig(objective="cmcm", lambda_cls=0.5, retrieval_margin=0.7)
    loss, parts = objective_loss(model, batch, cfg)
    s, v, logits = model(batch)
    labels = torch.tensor([[float(r in (m["relations"].split(","))) for r in VOCAB] for m in batch.metadata])
    expected, _ = cmcm_loss(s, v, logits, labels, torch.full((3,), 2.0), 0.7, 0.5)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert set(parts) == {"ret", "cls"}
    loss.backward()
    assert model.cam.text_part.weight.grad.abs().sum() > 0  # the CAM trains
    cmca, batch = _model_and_batch([])
    loss, parts = objective_loss(cmca, batch, TrainConfig(objective="cmca"))
    assert set(parts) == {"ret"} and torch.isfinite(loss)


def test_hard_negative_warmup():
    from training.retrieval.objective import negatives_at

    cfg = TrainConfig(objective="cmca", hard_negative_warmup=2)
    assert [negatives_at(cfg, e) for e in (0, 1, 2, None)] == ["mean", "mean", "hard", "hard"]
    assert negatives_at(TrainConfig(objective="cmca", negatives="mean", hard_negative_warmup=0), 5) == "mean"


def test_validation_and_test_metrics():
    model, batch = _model_and_batch(["Action"], n=10)
    cfg = TrainConfig(objective="cmcm-c", relation="Action", pool_size=500, n_pools=1)
    model.eval()  # as the loop's validation has it (no dropout)
    val = val_metrics(model, [batch], cfg)
    # the rank of each text's own image among the 10, computed here from the encodings
    s, v = model.encode(batch)
    sim = (s @ v.T).detach().numpy()
    rank = (sim >= np.diag(sim)[:, None]).sum(1)  # ties pessimistic
    assert val["val_medr"] == pytest.approx(float(np.median(rank)))
    out = evaluate_pairs(model, [batch], cfg, VOCAB)
    assert out["pairs"] == 10 and out["t2i"]["medr"] == pytest.approx(val["val_medr"])
    assert set(out["relations"]) == set(VOCAB) and set(out["relation_ap"]) == {"Action"}
    assert "t2i_refined" in out


def test_cam_hidden_flag_reaches_the_model(tmp_path):
    """`mmlinks train --cam-hidden N` -> TrainConfig -> the coherence backbone's model config ->
    a CAM with an N-wide ReLU layer; 0 (the default) is the paper's one linear layer."""
    import argparse

    from cli.train_options import add_train_args, train_config_from_args
    from training.retrieval.objective import model_config

    data = write_pair_dataset(tmp_path / "ds")
    manifest = Manifest.read(data)
    train = [str(p) for p in manifest.shard_paths(data, "train")]

    parser = argparse.ArgumentParser()  # the `train` command's generated TrainConfig flags
    add_train_args(parser)
    parser.add_argument("--data")

    def net_for(*flags):
        args = parser.parse_args(["--data", str(data), *flags])
        cfg = train_config_from_args(args)
        cfg.validate()
        return cfg, build(model_config(cfg, manifest, 12, 8, train))

    cfg, net = net_for("--objective", "cmcm", "--cam-hidden", "8", "--d-shared", "10")
    assert cfg.cam_hidden == 8 and net.cfg.cam_hidden == 8
    assert net.cam.out is not None and net.cam.out.in_features == 8 and net.cam.out.out_features == 3
    assert net.cam.text_part.out_features == 8
    cfg, net = net_for("--objective", "cmcm-c", "--relation", "Action", "--d-shared", "10")
    assert cfg.cam_hidden == 256 and net.cam.out.in_features == 256  # the default (issue #45)
    paper = ("--preset", "paper")
    cfg, net = net_for("--objective", "cmcm-c", "--relation", "Action", "--d-shared", "10", *paper)
    assert cfg.cam_hidden == 0 and net.cam.out is None and net.cam.text_part.out_features == 1
    _, net = net_for("--objective", "cmca", "--cam-hidden", "8", "--d-shared", "10")
    assert net.cam is None and net.cfg.cam_hidden == 0  # CMCA has no CAM to widen
    cfg, net = net_for("--objective", "cmca", "--retrieval-pooling", "bag", "--d-shared", "10")
    assert net.text.lstm is None and net.text.proj.in_features == net.cfg.word_dim  # the bag baseline
    with pytest.raises(SystemExit):  # an unknown pooling is refused where the flag enters
        net_for("--objective", "cmca", "--retrieval-pooling", "bags")
    with pytest.raises(MmlinksError, match="cam_hidden"):
        TrainConfig(objective="cmcm", cam_hidden=-1).validate()


@pytest.mark.slow
def test_cmcm_trains_registers_and_is_promoted(tmp_path, ray_local, capfd):
    """synth-coherence -> Beam build -> Ray Train (cmcm, 2 epochs) -> test metrics in MLflow ->
    the registered pyfunc ranks the gallery for a text -> `mmlinks promote` gates on val MedR."""
    import json

    import mlflow
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from cli.main import main
    from models.experiment import run_experiment
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.coherence_corpus import CoherenceSynthConfig, write_coherence_corpus

    write_coherence_corpus(tmp_path / "raw", CoherenceSynthConfig(pairs=60, image_size=64))
    manifest = build_dataset(
        BuildConfig(
            source="synthetic",
            input=str(tmp_path / "raw"),
            out=str(tmp_path / "ds"),
            split_ratios={"train": 0.6, "val": 0.2, "test": 0.2},
        )
    )
    assert manifest.relations == VOCAB
    cfg = TrainConfig(
        data=str(tmp_path / "ds"),
        objective="cmcm",
        epochs=2,
        d_shared=16,
        batch_docs=8,
        lr=3e-3,
        min_word_count=1,
        word_vectors="random",
        num_workers=0,  # in this process (tests/training/test_train.py: the same run as 1 worker)
        storage_path=str(tmp_path / "ray"),
        n_pools=1,
    )
    uri = tracking_uri(tmp_path)
    res = run_experiment(cfg, uri, model_name="coh")
    assert res.model_version == "1" and res.model_uri == "models:/coh@candidate"
    assert res.test["pairs"] == manifest.counts["splits"]["test"]
    assert {"t2i", "i2t", "t2i_refined", "relations", "relation_ap"} <= set(res.test)
    metrics = MlflowClient(uri).get_run(res.run_id).data.metrics
    assert {"test_medr", "test_refined_medr", "test_ap_Action", "val_medr"} <= set(metrics)
    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(res.model_uri)
    out = served.predict(pd.DataFrame([{"text": "a red circle"}]))
    assert len(out.iloc[0]["candidates"]) == 10 and len(out.iloc[0]["relation_probs"][0]) == len(VOCAB)
    # the packaged model carries the query bank drawn from the training captions (all of them
    # here) and ranks by the cosine minus each image's soft maximum over it (brute force)
    impl = served.unwrap_python_model()
    bank = impl.model.query_bank
    assert bank.shape == (manifest.counts["splits"]["train"], 16)
    from training.retrieval.query_bank import bank_captions, encode_captions

    captions = bank_captions(tmp_path / "ds", manifest, 2000)
    assert torch.allclose(bank, encode_captions(impl.model, impl.vocab, impl.max_tokens, captions), atol=1e-6)
    req = pd.DataFrame([{"text": "a red circle"}])
    got = served.predict(req, params={"top_k": 0, "refine": False}).iloc[0]
    s, v = impl.encode_texts(["a red circle"]), impl.encode_images(impl.gallery)
    t = impl.model.cfg.bank_temperature
    want = (s @ v.T)[0] - t * torch.log(torch.exp(bank @ v.T / t).mean(0))
    np.testing.assert_allclose(got["scores"], np.sort(want.numpy())[::-1], rtol=1e-4, atol=1e-5)
    capfd.readouterr()
    rc = main(
        [
            "promote",
            "--model-name",
            "coh",
            "--data",
            str(tmp_path / "ds"),
            "--workdir",
            str(tmp_path),
            "--json",
        ]
    )
    promoted = json.loads(capfd.readouterr().out)
    assert rc == 0 and promoted["promoted"], promoted
    assert promoted["candidate_metrics"]["pairs"] == manifest.counts["splits"]["val"]


def test_refinement_tuned_on_validation():
    from training.retrieval.objective import REFINE_LAMBDAS, REFINE_THRESHOLDS, tune_refinement

    model, batch = _model_and_batch(VOCAB, n=12)
    cfg = TrainConfig(objective="cmcm", n_pools=1)
    tuned = tune_refinement(model, [batch], cfg)
    assert len(tuned["grid"]) == len(REFINE_LAMBDAS) * len(REFINE_THRESHOLDS)
    plain = val_metrics(model, [batch], cfg)["val_medr"]
    assert all(g["medr"] == plain for g in tuned["grid"] if g["refine_lambda"] == 0.0)  # identity
    # the choice: lowest MedR, then highest R@1, then the smallest lambda
    best_medr = min(g["medr"] for g in tuned["grid"])
    ties = [g for g in tuned["grid"] if g["medr"] == best_medr]
    best_r1 = max(g["r1"] for g in ties)
    assert tuned["medr"] == best_medr and tuned["r1"] == best_r1
    assert tuned["refine_lambda"] == min(g["refine_lambda"] for g in ties if g["r1"] == best_r1)
    out = evaluate_pairs(model, [batch], cfg, VOCAB, tuned)
    assert out["t2i_refined_tuned"]["refine_lambda"] == tuned["refine_lambda"]
    cmca, batch = _model_and_batch([])
    assert tune_refinement(cmca, [batch], TrainConfig(objective="cmca")) is None


def test_the_margin_is_0_5_by_default_and_the_papers_0_3_under_its_preset():
    from training.config import preset_values

    assert TrainConfig(objective="cmca").retrieval_margin == 0.5
    assert TrainConfig(objective="cmcm", **preset_values("paper", "cmcm")).retrieval_margin == 0.3


def test_the_query_bank_is_on_by_default_and_off_under_the_paper_preset(tmp_path):
    from training.config import preset_values
    from training.retrieval.objective import model_config

    data = write_pair_dataset(tmp_path / "ds")
    manifest = Manifest.read(data)
    paths = [str(p) for p in manifest.shard_paths(data, "train")]
    on = model_config(TrainConfig(objective="cmca"), manifest, 10, 8, paths)
    off = model_config(
        TrainConfig(objective="cmca", **preset_values("paper", "cmca")), manifest, 10, 8, paths
    )
    assert (on["query_bank"], on["bank_temperature"], off["query_bank"]) == (2000, 0.1, 0)


@pytest.mark.parametrize(
    ("objective", "sampling"),
    [("cmca", "similar"), ("cmcm", "similar"), ("cmcm-c", "similar"), ("ap", "similar"), ("news", "random")],
)
def test_auto_batches_are_similar_for_coherence_retrieval_and_linking(objective, sampling):
    """Batches of alike pairs rank better (issue #45); the news family keeps random batches, and
    the paper preset random ones everywhere; a value given is kept."""
    from training.config import preset_values

    given = {"relation": "Visible"} if objective == "cmcm-c" else {}
    assert TrainConfig(objective=objective, **given).batch_sampling == sampling
    paper = preset_values("paper", objective)
    assert TrainConfig(objective=objective, **given, **paper).batch_sampling == "random"
    assert TrainConfig(objective=objective, **given, batch_sampling="random").batch_sampling == "random"
    assert TrainConfig(objective=objective, **given, batch_sampling="similar").batch_sampling == "similar"


def test_auto_batches_stay_random_for_the_bag_baseline():
    """The floor the default may not fall below is trained plainly (issue #44)."""
    assert TrainConfig(objective="ap", backbone="bag").batch_sampling == "random"


def test_the_query_bank_is_drawn_from_the_training_captions(tmp_path):
    from training.retrieval.query_bank import bank_captions, encode_captions, fill_query_bank

    data = write_pair_dataset(tmp_path / "ds")
    manifest = Manifest.read(data)
    train = [s for d in pair_docs(40, seed=3)[:8] for s in d.sentences]
    assert bank_captions(data, manifest, 100) == train  # all of them, in split order
    three = bank_captions(data, manifest, 3)
    assert len(three) == 3 and set(three) <= set(train) and three == bank_captions(data, manifest, 3)
    assert bank_captions(data, manifest, 0) == []
    vocab = Vocabulary.build(train, 1)
    net = build({**_model_and_batch([])[0].cfg.to_dict(), "vocab_size": len(vocab), "query_bank": 5})
    assert fill_query_bank(net, data, manifest, vocab, 20) == 5
    want = encode_captions(net, vocab, 20, bank_captions(data, manifest, 5))
    assert net.query_bank.shape == (5, 10) and torch.allclose(net.query_bank, want)


@pytest.mark.parametrize(
    "shards,per_doc,size,shard_rows", [(1, 1, 5, 50_000), (3, 3, 7, 2), (4, 2, 100, 3), (2, 1, 13, 1)]
)
def test_the_streamed_bank_draw_is_the_whole_split_draw(
    tmp_path, shards, per_doc, size, shard_rows, monkeypatch
):
    """The bank is drawn shard by shard (``SHARD_ROWS`` documents decoded at a time), yet keeps
    exactly the captions a draw over the whole split's sentence list keeps (the brute force)."""
    import training.retrieval.query_bank as qb

    docs = pair_docs(24, seed=5)
    for i, d in enumerate(docs):
        d.sentences = [f"{s} {j}" for j in range(1 + i % per_doc) for s in d.sentences[:1]]
        d.split = "train"
    infos = []
    for k in range(shards):
        rel = f"shards/train-{k:05d}.parquet"
        rows, nbytes, sha = write_shard(tmp_path / rel, docs[k::shards])
        infos.append(ShardInfo(rel, "train", rows, nbytes, sha))
    manifest = Manifest(
        SCHEMA_VERSION,
        "v",
        "synthetic",
        {"splits": {"train": 24}, "dropped": {}},
        FeatureExtractorInfo(*EXTRACTOR),
        infos,
    )
    manifest.write(tmp_path)
    every = [s for k in range(shards) for d in docs[k::shards] for s in d.sentences]
    want = (
        every
        if len(every) <= size
        else [every[i] for i in np.sort(np.random.default_rng(3).choice(len(every), size, replace=False))]
    )
    monkeypatch.setattr(qb, "SHARD_ROWS", shard_rows)

    def whole_split(*_a, **_k):
        raise AssertionError("the whole split's sentences read at once")

    monkeypatch.setattr("schemas.shards.read_table", whole_split)
    assert qb.bank_captions(tmp_path, Manifest.read(tmp_path), size, seed=3) == want
