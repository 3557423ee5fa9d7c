"""The one progress path: a tqdm bar fed by a poll function, or the elapsed time without one."""

import time

from schemas.progress import polled_progress


def test_the_bar_follows_what_the_poll_reports(capsys):
    done = iter([None, (1, {"val_loss": "0.5"}), (1, {}), (3, {"val_loss": "0.2"})])
    with polled_progress("train", total=3, unit="epoch", poll=lambda: next(done, (3, {})), interval_s=0.01):
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert "3/3" in err and "val_loss=0.2" in err
    # before the first step the poll's postfix says what goes on (the image side's trials, issue #60)
    early = iter([(0, {}), (0, {"stage": "choosing"}), (0, {"stage": "chosen"})])
    with polled_progress("train", total=3, unit="epoch", poll=lambda: next(early, (1, {})), interval_s=0.01):
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert "0/3" in err and "stage=choosing" in err and "stage=chosen" in err


def test_without_a_poll_it_shows_the_elapsed_time_and_nothing_when_disabled(capsys):
    with polled_progress("beam build", interval_s=0.01):
        time.sleep(0.05)
    assert "beam build: 00:0" in capsys.readouterr().err
    with polled_progress("beam build", enabled=False):
        pass
    assert capsys.readouterr().err == ""
