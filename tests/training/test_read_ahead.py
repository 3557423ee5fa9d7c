"""``training.epoch_batches.read_ahead``: on a GPU the next batches are made on the host while
the card runs the step (issue #63), in the order and with the draws of a plain loop."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import InMemoryShard, small_train_config
from training.epoch_batches import read_ahead


@given(st.lists(st.integers(), max_size=30), st.integers(1, 4))
def test_the_same_items_in_the_same_order(items, depth):
    assert list(read_ahead(iter(items), depth)) == items


def test_the_next_item_is_made_while_the_caller_holds_this_one():
    """The plain loop makes item 1 only when asked; read ahead, it is made while item 0 is
    in use (the guard's timeout only bounds a failure: no timing is asserted)."""
    making_1 = threading.Event()

    def items():
        yield 0
        making_1.set()
        yield 1

    plain = items()
    assert next(plain) == 0 and not making_1.wait(0.2)
    making_1.clear()
    ahead = read_ahead(items())
    assert next(ahead) == 0
    assert making_1.wait(30), "item 1 was not made in the background"
    assert list(ahead) == [1]


def test_an_error_comes_at_its_item_and_closing_early_stops_the_reading():
    made = []

    def items(fail_at=None):
        for i in range(100):
            if i == fail_at:
                raise ValueError(f"bad item {i}")
            made.append(i)
            yield i

    got = []
    with pytest.raises(ValueError, match="bad item 3"):
        for item in read_ahead(items(fail_at=3)):
            got.append(item)
    assert got == [0, 1, 2]
    made.clear()
    ahead = read_ahead(items(), depth=2)
    assert next(ahead) == 0
    ahead.close()
    assert len(made) <= 1 + 2 + 1  # the item taken, the two ahead, at most one in flight


def test_an_epoch_read_ahead_trains_on_the_same_batches_as_the_plain_loop(dataset, tmp_path):
    """Every draw of the epoch's generator (the sampler's shuffles, NoStruct's pairs, the image
    order) is made by one thread in one order, so the batches are the ones the plain loop
    makes: ``train_epoch`` reads ahead on a GPU only, and a run must not change with that."""
    from schemas.shards import read_table
    from training.data import TRAINING_COLUMNS
    from training.driver import check_inputs, worker_loop_config
    from training.epoch_batches import epoch_steps
    from training.loop import make_worker

    for objective in ("ap", "nostruct"):
        inp = check_inputs(small_train_config(dataset, tmp_path, objective=objective))
        config, _ = worker_loop_config(inp, "ahead")
        w = make_worker(config, 0, 1)
        table = read_table(inp.train_paths, columns=[*TRAINING_COLUMNS, *w.objective.columns])

        def steps(w, table, ahead: bool):
            out = epoch_steps(InMemoryShard(table), w.cfg, np.random.default_rng(7), w.batch)
            return list(read_ahead(out) if ahead else out)

        plain, ahead = steps(w, table, False), steps(w, table, True)
        assert len(plain) == len(ahead) > 1
        for (a, n_a), (b, n_b) in zip(plain, ahead, strict=True):
            assert n_a == n_b and (a is None) == (b is None)
            if a is not None:
                assert a.doc_ids == b.doc_ids
                assert torch.equal(a.tokens, b.tokens) and torch.equal(a.features, b.features)
