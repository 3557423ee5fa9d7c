"""Models registered before issue #61 moved the pyfunc wrappers to ``models/`` keep loading:
MLflow pickled each wrapper class by its old module path (``training.packaging``,
``training.retrieval.serving``, ``training.news.serving``), which the alias modules keep.
The folders were written by the code before the move (tests/fixtures/models_before_61/README.md)."""

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models_before_61"


def _load(name: str):
    return mlflow.pyfunc.load_model(str(FIXTURES / name))


def _pickled_path(name: str) -> bytes:
    return (FIXTURES / name / "python_model.pkl").read_bytes()


@pytest.mark.parametrize(
    ("name", "old_module"),
    [
        ("link", b"training.packaging"),
        ("retrieval", b"training.retrieval.serving"),
        ("news", b"training.news.serving"),
    ],
)
def test_the_fixtures_were_pickled_by_the_old_paths(name, old_module):
    assert old_module in _pickled_path(name)


def test_a_link_model_saved_before_the_move_loads_and_links():
    model = _load("link")
    features = [[0.1 * j] * 6 for j in range(1, 4)]
    doc = {"sentences": ["a red star", "the blue dot"], "image_features": features}
    out = model.predict(pd.DataFrame([doc]))
    scores = np.asarray(out["scores"][0])
    assert scores.shape == (2, 3) and np.isfinite(scores).all()
    assert all(len(link) == 2 for link in out["links"][0])


def test_a_retrieval_model_saved_before_the_move_loads_and_ranks_its_gallery():
    model = _load("retrieval")
    out = model.predict(pd.DataFrame([{"text": "a red star"}]), params={"top_k": 3})
    assert len(out["candidates"][0]) == 3
    assert set(out["candidates"][0]) <= {"d0", "d1", "d2", "d3"}
    assert list(out["scores"][0]) == sorted(out["scores"][0], reverse=True)
    assert len(out["relation_probs"][0]) == 3  # CMCM: the CAM's probabilities per candidate


def test_a_news_model_saved_before_the_move_loads_and_searches_its_archive():
    model = _load("news")
    out = model.predict(pd.DataFrame([{"language": "en", "headline": "red cross", "caption": "blue dot"}]))
    assert len(out["image_ids"][0]) == 10  # the tiny dataset's 10 distinct photos
    assert list(out["scores"][0]) == sorted(out["scores"][0], reverse=True)
    assert all(u.startswith("img/") for u in out["uris"][0])
