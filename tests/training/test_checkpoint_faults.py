"""The cheap halves of the training fault scenarios (``tests/faults/test_train_faults.py`` runs
them for real): the full-disk message, a resume check past a checkpoint cut short, and what the
fault hooks read from the environment."""

import json

from schemas.errors import MmlinksError
from training.checkpoints import out_of_space_message, resumed_config, saved_train_config
from training.fault_hooks import after_epoch, kill_config

RAY_TEXT = (  # what Ray Train's failure says when pyarrow cannot write a checkpoint to storage
    "training failed: OSError: [Errno 28] Error writing bytes to file. "
    "Detail: [errno 28] No space left on device"
)


def test_a_full_disk_is_one_line_naming_the_storage_path():
    try:
        try:
            with open("/dev/full", "w") as fh:
                fh.write("x" * 100_000)
        except OSError as exc:
            raise MmlinksError("training failed") from exc
    except MmlinksError as wrapped:
        msg = out_of_space_message(wrapped, "/data/ray")
    assert msg.startswith(
        "training ran out of space writing checkpoints to /data/ray (no space left on device)"
    )
    assert "\n" not in msg and "--run-name" in msg
    assert "(no space left on device)" in out_of_space_message(MmlinksError(RAY_TEXT), "/s")
    assert (
        out_of_space_message(MmlinksError("training failed: ValueError: the image file too large"), "/s")
        is None
    )


def test_resume_check_skips_a_checkpoint_cut_short(tmp_path):
    import os

    run = tmp_path / "r"
    whole, cut = run / "checkpoint_a", run / "checkpoint_b"
    whole.mkdir(parents=True), cut.mkdir()
    (whole / "meta.json").write_text(json.dumps({"train": {"epochs": 3}}))
    (cut / "meta.json").write_text('{"train": {"ep')  # the disk filled up mid-file
    os.utime(whole / "meta.json", (1, 1))  # the cut one is the newest
    assert saved_train_config(str(tmp_path), "r") == {"epochs": 3}


def test_a_resumed_config_takes_both_its_parts_from_one_checkpoint(tmp_path):
    """The train and model configs come from the same ``meta.json``: the newest holding no model
    config does not borrow an older checkpoint's image side (two reads took each part's newest)."""
    import os

    run = tmp_path / "r"
    old, new = run / "checkpoint_a", run / "checkpoint_b"
    old.mkdir(parents=True), new.mkdir()
    side = {"image_centring": "balanced", "image_dropout": 0.4, "image_mean_weight": 1.0}
    (old / "meta.json").write_text(
        json.dumps({"train": {"image_centring": "auto", "epochs": 3}, "model": side})
    )
    (new / "meta.json").write_text(json.dumps({"train": {"image_centring": "auto", "epochs": 4}}))
    os.utime(old / "meta.json", (1, 1))
    assert resumed_config(str(tmp_path), "r") == {"image_centring": "auto", "epochs": 4}
    os.utime(new / "meta.json", (0, 0))  # the older one newest: its own side, the pre-#60 way
    assert resumed_config(str(tmp_path), "r") == {**side, "epochs": 3, "image_centre": "mean"}


def test_fault_hooks_log_epochs_and_do_nothing_unasked(tmp_path):
    assert kill_config({}) is None
    log = tmp_path / "epochs"
    cfg = kill_config({"MMLINKS_TEST_EPOCH_LOG": str(log)})
    for epoch in range(3):
        after_epoch(0, epoch, cfg)
        after_epoch(1, epoch, cfg)  # only rank 0 logs
    assert log.read_text().split() == ["0", "1", "2"]
    both = {"MMLINKS_TEST_HANG_AFTER_EPOCH": "1", "MMLINKS_TEST_KILL_MARKER": "m"}
    assert kill_config(both) == {"epoch": "1", "marker": "m", "action": "hang"}
