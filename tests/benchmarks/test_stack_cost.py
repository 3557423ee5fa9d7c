"""``benchmarks/stack_cost.py`` (issue #63): the bare loop and ``mmlinks train --workers 0`` on one
tiny corpus, with the figures the docs' table reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# by path: an installed dependency ships a top-level ``benchmarks`` package of its own
_SPEC = importlib.util.spec_from_file_location(
    "stack_cost", Path(__file__).resolve().parents[2] / "benchmarks" / "stack_cost.py"
)
stack_cost = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(stack_cost)


def test_steady_figures_leave_out_the_warm_up_epoch():
    assert stack_cost.steady([1.0, 5.0, 7.0]) == 6.0
    assert stack_cost.steady([3.0]) == 3.0 and stack_cost.steady([]) is None


@pytest.mark.slow
def test_the_bare_loop_and_the_in_process_stack_on_one_corpus(tmp_path):
    out = stack_cost.main(
        [
            "--docs",
            "60",
            "--epochs",
            "2",
            "--rows",
            "bare1,w0",
            "--set",
            "d_multi=16",
            "--out",
            str(tmp_path / "o.json"),
        ]
    )
    bare, stack = out["rows"]["bare1"], out["rows"]["w0"]
    assert [e["docs"] for e in bare["epochs"]] == [60, 60] and bare["docs_per_s"] > 0
    assert set(bare["parts_s"]) == {"data", "forward", "solver", "backward", "optimizer"}
    assert bare["parts_s"]["solver"] <= bare["parts_s"]["forward"]  # the solver runs inside the forward
    assert "error" not in stack, stack.get("error")
    assert stack["train_docs"] == 60 and stack["docs_per_s"] > 0 and stack["val_s"] > 0
    assert stack["epoch_wall_s"] > 0 and len(stack["per_epoch"]["docs_per_s"]) == 2
    assert out["w0_vs_bare1"] == pytest.approx(stack["docs_per_s"] / bare["docs_per_s"], rel=1e-2)
    assert (tmp_path / "o.json").exists()


def test_a_failed_stack_row_is_recorded_and_the_other_rows_kept(tmp_path, monkeypatch):
    def fails(*_a, **_k):
        raise SystemExit("mmlinks train ... failed (1): out of space")

    monkeypatch.setattr(stack_cost, "stack_row", fails)
    out = stack_cost.main(["--docs", "40", "--epochs", "1", "--rows", "bare1,w0", "--set", "d_multi=16"])
    assert "out of space" in out["rows"]["w0"]["error"] and out["rows"]["w0"]["docs_per_s"] is None
    assert out["rows"]["bare1"]["docs_per_s"] > 0 and "w0_vs_bare1" not in out
