"""A new local SQLite store starts as a copy of an empty, migrated one (training.tracking)."""

from __future__ import annotations

import sqlite3

from mlflow.tracking import MlflowClient

from training import tracking


def is_fully_migrated(db) -> bool:
    """Every table MLflow's models define, at MLflow's newest schema revision."""
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import _get_latest_schema_revision

    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
        revision = con.execute("select version_num from alembic_version").fetchone()[0]
    return set(Base.metadata.tables) <= tables and revision == _get_latest_schema_revision()


def test_new_stores_are_copies_of_one_migrated_template_and_work_like_migrated_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        uri = f"sqlite:///{tmp_path / name / 'mlflow.db'}"
        experiment_id = tracking.configure(uri, "mmlinks")
        client = MlflowClient(uri)
        run = client.create_run(experiment_id)
        client.log_metric(run.info.run_id, "auc", 0.5)
        assert client.get_run(run.info.run_id).data.metrics == {"auc": 0.5}
        # MLflow added its Default experiment with this store's artifact root, not the template's
        default = client.get_experiment("0")
        assert default.name == "Default" and default.artifact_location == str(tmp_path / "mlruns" / "0")
        assert is_fully_migrated(tmp_path / name / "mlflow.db")

    (template,) = (tmp_path / "cache" / "mmlinks").iterdir()
    assert is_fully_migrated(template)
    with sqlite3.connect(template) as con:  # the template itself stays empty
        assert con.execute("select count(*) from experiments").fetchone() == (0,)


def test_an_existing_store_is_left_alone_and_an_unusable_cache_falls_back_to_mlflow(tmp_path, monkeypatch):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'w' / 'mlflow.db'}"
    first = tracking.configure(uri, "mmlinks")  # no template can be made: MLflow migrates
    before = (tmp_path / "w" / "mlflow.db").stat().st_mtime_ns
    tracking.seed_sqlite_store(uri)
    assert (tmp_path / "w" / "mlflow.db").stat().st_mtime_ns == before
    assert tracking.configure(uri, "mmlinks") == first
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["mlflow.db"]  # no temporary left
