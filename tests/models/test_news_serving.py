"""The packaged news image selection model: an article in, the archive's images ranked out,
through pyfunc loading and MLflow's scoring server over loopback HTTP (an unsupported language
is a 400 with its reason). A randomly initialised news model, written as a training checkpoint,
and news shards in the real layout with random CNN features: no Ray fit."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException

from archive.build import build_archive_index
from models.news_packaging import log_news_model, train_languages
from models.news_serving import ARCHIVE_ENV, evaluate_news
from models.news_threads import SERVE_THREADS
from schemas.errors import MmlinksError
from tests.conftest import free_port
from tests.training.news.helpers import news_checkpoint, write_news_dataset
from training.checkpoints import load_checkpoint_model
from training.news.encode import encode_articles


@pytest.fixture(scope="module")
def news_model(tmp_path_factory):
    """(loaded pyfunc, model folder, shard paths, run id)."""
    root = tmp_path_factory.mktemp("news-serve")
    data, docs = write_news_dataset(root / "data")
    ckpt, vocab = news_checkpoint(root / "ckpt", docs)
    net = load_checkpoint_model(ckpt)[0]
    paths = sorted(data.glob("*.parquet"))
    train = [str(data / "train-00000.parquet")]
    # a model folder, not a tracking store: a sqlite store's first migration costs seconds;
    # the logged form (no path) is the same files, exercised by test_news_train.py
    index = build_archive_index(net, [str(p) for p in paths], "flat", {"run_id": "run-1"})
    model_uri = log_news_model(str(ckpt), vocab, index, train_languages(train), "run-1", root / "model")
    return mlflow.pyfunc.load_model(model_uri), model_uri, [str(p) for p in paths], "run-1"


def test_an_article_ranks_every_distinct_archive_image_as_brute_force_does(news_model):
    loaded, *_ = news_model
    model = loaded.unwrap_python_model()
    assert len(model.archive) == 10 and model.languages == ("de", "en")  # 20 samples, 10 photos
    article = {"language": "de", "headline": "red storm", "body": "", "caption": "blau kreuz"}
    out = loaded.predict(pd.DataFrame([article]), params={"top_k": 3})
    ids, scores = out["image_ids"][0], out["scores"][0]
    q = encode_articles(model.model, model.vocab, model.max_tokens, [article]).numpy()[0]
    with torch.no_grad():
        archive = model.model.image(torch.as_tensor(np.stack([f for f in _archive_features(news_model[2])])))
    brute = archive.numpy() @ q
    np.testing.assert_allclose(scores, np.sort(brute)[::-1][:3], atol=1e-5)
    assert out["uris"][0][0].startswith("img/") and len(set(ids)) == 3


def _archive_features(paths):
    from archive.build import archive_images

    return archive_images(paths)[2]


def test_predict_runs_on_the_packaged_threads_and_gives_the_process_its_own_back(news_model):
    import faiss

    loaded, *_ = news_model
    model = loaded.unwrap_python_model()
    assert model.threads == SERVE_THREADS  # recorded in news.json by log_news_model
    seen = []
    search = model.archive.search_rows

    def spy(q, k):
        seen.append((torch.get_num_threads(), faiss.omp_get_max_threads()))
        return search(q, k)

    torch.set_num_threads(2)
    faiss.omp_set_num_threads(2)
    model.threads = {"encode": 1, "search": 1}
    model.archive.search_rows = spy
    try:
        loaded.predict(pd.DataFrame([{"language": "en", "headline": "red cross"}]), params={"top_k": 2})
        assert seen == [(1, 1)]
        assert torch.get_num_threads() == 2 and faiss.omp_get_max_threads() == 2
    finally:
        model.threads = SERVE_THREADS
        del model.archive.search_rows


def test_missing_sources_are_fine_but_an_unknown_language_or_no_words_is_a_bad_request(news_model):
    loaded, *_ = news_model
    one = loaded.predict(pd.DataFrame([{"language": "en", "caption": "green dot"}]), params={"top_k": 2})
    assert len(one["image_ids"][0]) == 2
    for article, reason in (
        (
            {"language": "fr", "headline": "red"},
            "unsupported language 'fr'; this model was trained on de, en",
        ),
        ({"language": "en", "lead": "  "}, "no words in any source"),
    ):
        with pytest.raises(MlflowException, match=reason) as err:
            loaded.predict(pd.DataFrame([article]))
        assert err.value.error_code == "INVALID_PARAMETER_VALUE"


def test_the_scoring_server_answers_an_article_and_refuses_a_language_with_400(news_model):
    import uvicorn
    from mlflow.pyfunc import scoring_server

    loaded, *_ = news_model
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(scoring_server.init(loaded), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        ok = _post(
            port, {"dataframe_records": [{"language": "en", "headline": "red cross"}], "params": {"top_k": 4}}
        )
        assert ok[0] == 200 and len(ok[1]["predictions"][0]["image_ids"]) == 4
        bad = _post(port, {"dataframe_records": [{"language": "fr", "headline": "rouge"}]})
        assert bad[0] == 400 and "unsupported language 'fr'" in bad[1]["message"]
    finally:
        server.should_exit = True
        thread.join(10)


def _post(port: int, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_an_archive_of_another_run_is_refused_and_the_gate_metrics_are_computed(
    news_model, tmp_path, monkeypatch
):
    loaded, model_uri, paths, run_id = news_model
    model = loaded.unwrap_python_model()
    other = build_archive_index(model.model, paths, "flat", {"run_id": "another-run"})
    monkeypatch.setenv(ARCHIVE_ENV, str(other.save(tmp_path / "other")))
    with pytest.raises(Exception, match="built from run another-run"):
        mlflow.pyfunc.load_model(model_uri)
    train = [p for p in paths if "train" in p]  # 12 samples, 6 photos
    same = build_archive_index(model.model, train, "hnsw", {"run_id": run_id})
    monkeypatch.setenv(ARCHIVE_ENV, str(same.save(tmp_path / "same")))
    assert len(mlflow.pyfunc.load_model(model_uri).unwrap_python_model().archive) == 6
    m = evaluate_news(model, paths)
    assert m["pairs"] == 20 and 1 <= m["medr"] <= 20 and {"r1", "r10", "i2t_medr"} <= set(m)
    with pytest.raises(MmlinksError, match="at least 2"):
        evaluate_news(model, [])


def _direct_ranks(model, paths) -> np.ndarray:
    """Each sample's text-to-image rank among the samples of ``paths``, one sample at a time."""
    from schemas.news import sources_of
    from schemas.shards import read_table

    table = read_table(paths, columns=["doc_id", "sentences", "images", "metadata"]).sort_by("doc_id")
    texts, images = [], []
    for sents, meta, ims in zip(*(table.column(c).to_pylist() for c in ("sentences", "metadata", "images"))):
        art = dict(zip(sources_of(dict(meta)), sents, strict=True))
        texts.append(encode_articles(model.model, model.vocab, model.max_tokens, [art])[0].numpy())
        with torch.no_grad():
            images.append(model.model.image(torch.tensor([ims[0]["features"]])).numpy()[0])
    sim = np.array([[float(t @ v) for v in images] for t in texts])
    return np.array(
        [1 + sum(sim[i, j] >= sim[i, i] for j in range(len(sim)) if j != i) for i in range(len(sim))]
    )


def test_mmlinks_evaluate_scores_a_news_model_both_directions(news_model, tmp_path, capfd):
    from cli.main import main

    loaded, model_uri, paths, _ = news_model
    model = loaded.unwrap_python_model()
    data = str(Path(paths[0]).parent)
    out = tmp_path / "ranks.jsonl"
    argv = [
        "evaluate",
        "--data",
        data,
        "--split",
        "train",
        "--pools",
        "1",
        "--per-doc-out",
        str(out),
        "--json",
    ]
    assert main([*argv, "--model-uri", model_uri]) == 0
    got = json.loads(capfd.readouterr().out)
    m = got["models"][model_uri]
    ranks = _direct_ranks(model, [p for p in paths if "train" in p])  # 12 samples: one pool of all
    assert m["pairs"] == 12 and m["t2i"]["medr"] == pytest.approx(np.median(ranks))
    for k in (1, 5, 10):
        assert m["t2i"][f"r{k}"] == pytest.approx(100 * np.mean(ranks <= k))
    assert {"medr", "r1", "r5", "r10"} <= set(m["i2t"])
    assert [json.loads(x)["t2i_rank"] for x in out.read_text().splitlines()] == ranks.tolist()
    # the checkpoint inside the model folder gives the same figures (the table, no --json twice)
    folder = Path(model_uri) / "artifacts"
    again = tmp_path / "again.jsonl"
    argv = ["evaluate", "--data", data, "--split", "train", "--pools", "1", "--per-doc-out", str(again)]
    assert (
        main([*argv, "--checkpoint", str(folder / "checkpoint"), "--vocab", str(folder / "vocab.json")]) == 0
    )
    assert f"{m['t2i']['medr']:.1f}" in capfd.readouterr().out and again.read_text() == out.read_text()


def test_news_models_are_gated_on_validation_medr_and_r10_not_auc(news_model):
    from models.gate import Gate
    from models.registry import check_gate
    from orchestration.quality import Thresholds, check_evaluation_floor
    from orchestration.settings import Settings

    loaded, _, paths, _ = news_model
    m = evaluate_news(loaded.unwrap_python_model(), paths)
    assert Settings(objectives={"news": {"objective": "news"}}).split_for("news") == "val"
    assert check_evaluation_floor(m, Thresholds(min_r10=m["r10"])).passed
    floor = check_evaluation_floor(m, Thresholds(min_r10=m["r10"] + 1, max_medr=m["medr"] - 0.5))
    assert (
        not floor.passed
        and "r10" in floor.description
        and "medr" in floor.description
        and "auc" not in floor.description
    )
    assert check_gate(m, dict(m), Gate()) == []
    worse = check_gate({**m, "medr": m["medr"] + 2, "r10": m["r10"] - 5}, m, Gate(max_medr_rise=1.0))
    assert len(worse) == 2 and all("auc" not in w for w in worse)
    assert check_gate({**m, "medr": float("nan")}, None, Gate()) != []


@pytest.mark.parametrize(
    "threads", [{"encode": 0, "search": 1}, {"encode": 1}, {"encode": "2", "search": 1}, [1, 1]]
)
def test_bad_serving_threads_are_refused_in_one_line_when_packaged(threads):
    from models.news_threads import checked_threads

    with pytest.raises(MmlinksError, match="serving threads must be"):
        checked_threads(threads)
    assert checked_threads(None) is None
    assert checked_threads({"encode": 2, "search": 1}) == {"encode": 2, "search": 1}
