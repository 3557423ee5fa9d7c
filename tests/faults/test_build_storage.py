"""A build's output folder under a full disk and under two builds at once (issue #19).

Disk full is real: the failing build runs in a child process whose output folder is a 4 MiB
tmpfs filled to within a few KiB (mounted in a user and mount namespace, ``unshare -rm``, so no
host privilege is needed), writes fail with ENOSPC from the kernel. Where namespaces are not
allowed (some CI containers, even as root) the child instead gets ``RLIMIT_FSIZE`` with SIGXFSZ
ignored, so the kernel fails the same writes with EFBIG: the same code path (an OSError from a
shard write), never a skip. The racing builds are real commits (``commit_files``) of staged
shards from two threads into one folder while a third thread reads and verifies the current
version the whole time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.commit import commit_files
from schemas.errors import MmlinksError
from schemas.manifest import MANIFEST_NAME, Manifest
from tests.conftest import venv_env

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HEADROOM = 8192  # free bytes left on the tmpfs: the staging folder's small files fit, a shard not
FSIZE_LIMIT = 8192  # the fallback's largest file

# The child: take the reference output folder (its version current, its image store warm), make
# its disk full, build other split ratios (a new version, features from the cache), copy the
# folder back out to the host for the test to inspect, print the build's error.
CHILD = """
import json, os, resource, shutil, signal, subprocess, sys
from pipelines.build import build_dataset
from tests.faults.conftest import tiny_cfg
mode, corpus, reference, mnt, result, headroom, fsize = sys.argv[1:8]
out = os.path.join(mnt, "out")
if mode == "tmpfs":
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
shutil.copytree(reference, out)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
if mode == "tmpfs":
    st = os.statvfs(mnt)
    with open(os.path.join(mnt, "ballast"), "wb") as fh:
        fh.write(bytes(max(0, st.f_bavail * st.f_frsize - int(headroom))))
else:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(fsize), hard))
try:
    build_dataset(tiny_cfg(corpus, out, split_ratios={"train": 0.4, "val": 0.3, "test": 0.3}))
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
shutil.copytree(out, result, symlinks=True)
print(json.dumps({"error": error}))
"""


def namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_disk_full_during_a_build_keeps_the_current_version(tiny, tiny_train, tmp_path, fault_stats):
    """The full disk fails the build in one line and keeps the current version whole; the same
    build rerun with room writes the fault-free build's bytes (``tiny_train``: the same corpus
    and options built without a fault)."""
    corpus, reference = tiny
    mode = "tmpfs" if namespaces_work() else "fsize"
    mnt, result = tmp_path / "mnt", tmp_path / "result"
    mnt.mkdir()
    cmd = [sys.executable, "-c", CHILD, mode, str(corpus), str(reference), str(mnt), str(result)]
    cmd += [str(HEADROOM), str(FSIZE_LIMIT)]
    if mode == "tmpfs":
        cmd = ["unshare", "-rm", *cmd]
    proc = subprocess.run(cmd, env=venv_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    fault_stats.add(faults_injected=1)

    before = Manifest.read(reference)
    expected = "no space left on device" if mode == "tmpfs" else "file too large"
    assert error is not None and error.startswith("MmlinksError: the build ran out of space"), error
    assert expected in error and f"current version {before.dataset_version}" in error
    assert "\n" not in error
    after = Manifest.read(result)  # the current version is the one before, every shard verified
    assert after.to_json() == before.to_json() and len(after.shard_paths(result)) == len(after.shards)
    assert [p.name for p in (result / "versions").iterdir()] == [before.dataset_version]
    assert not list(result.glob(".staging-*"))  # no half-written staging left
    assert not [p for p in result.rglob("*") if ".tmp-" in p.name]  # nor temporary files

    from pipelines.build import build_dataset
    from tests.faults.conftest import tiny_cfg
    from tests.faults.test_build_kills import shard_bytes

    rerun = build_dataset(tiny_cfg(corpus, result, split_ratios={"train": 0.4, "val": 0.3, "test": 0.3}))
    want = Manifest.read(tiny_train)
    assert rerun.to_json() == want.to_json() and shard_bytes(result) == shard_bytes(tiny_train)
    assert (result / rerun.dead_letter).read_bytes() == (tiny_train / want.dead_letter).read_bytes()
    fault_stats.add(invariant_checks=8)


def staged_commit(out: Path, reference: Path, version: str, tag: str) -> None:
    """Stage the reference's shards as ``version`` (a real staging folder) and commit them."""
    ref = json.loads((reference / MANIFEST_NAME).read_text())
    old = f"versions/{ref['dataset_version']}/"
    staging = out / f".staging-{tag}"
    (staging / "shards").mkdir(parents=True)
    names = []
    for s in ref["shards"]:
        name = s["path"].removeprefix(old)
        shutil.copyfile(reference / s["path"], staging / "shards" / name)
        names.append(name)
        s["path"] = f"versions/{version}/{name}"
    shutil.copyfile(reference / ref["dead_letter"], staging / "dead_letter.jsonl")
    ref.update(dataset_version=version, dead_letter=f"versions/{version}/dead_letter.jsonl")
    commit_files(str(out), str(staging), version, names, json.dumps(ref, sort_keys=True))
    shutil.rmtree(staging)


def test_racing_builds_into_one_output_never_expose_a_broken_version(tiny, tmp_path, fault_stats):
    """Two builders commit 25 times each, to versions the other also commits (a same-version
    rerun) and to versions of their own; a reader verifies the current version throughout."""
    _, reference = tiny
    out = tmp_path / "out"
    out.mkdir()
    stop, broken, reads = threading.Event(), [], [0]

    def reader():
        """A failed check counts only while the manifest it read is still the current one: a
        reader overtaken by two newer commits (its version pruned) is the retention policy."""
        manifest = out / MANIFEST_NAME
        while not stop.is_set():
            before = None
            try:
                before = manifest.stat()
                m = Manifest.read(out)
                m.shard_paths(out)  # each shard present with its size and sha256
                (out / m.dead_letter).stat()
            except (MmlinksError, OSError) as exc:
                if before is None:  # no version committed yet
                    continue
                try:
                    after = manifest.stat()
                except OSError:
                    continue
                if (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns):
                    broken.append(str(exc))
            reads[0] += 1

    def builder(k: int):
        for i in range(25):
            version = f"race-{(i + k) % 3}" if i % 2 else f"race-{k}-{i}"
            staged_commit(out, reference, version, f"{k}-{i}")
            time.sleep(0.01)  # let the reader in (the GIL): it must check while commits go on

    threads = [threading.Thread(target=builder, args=(k,)) for k in range(2)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 30
    while reads[0] == 0 and watcher.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # on a loaded machine the reader may not have been scheduled yet
    stop.set()
    watcher.join()
    fault_stats.add(faults_injected=50, invariant_checks=reads[0])
    assert not broken, broken[:3]
    assert reads[0] > 0
    m = Manifest.read(out)
    assert len(m.shard_paths(out)) == len(m.shards)
    assert len(list((out / "versions").iterdir())) <= 2  # the current one and the one it replaced
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]


def test_storage_full_is_recognised_through_beams_wrapping():
    """Beam re-raises a worker's error with its text in another exception: both are a full disk;
    an image merely "too large" is not."""
    import errno

    from pipelines.build import storage_full

    assert storage_full(OSError(errno.ENOSPC, "No space left on device")) == "no space left on device"
    wrapped = RuntimeError("WriteShards failed: OSError: [Errno 122] Disk quota exceeded [while running]")
    assert storage_full(wrapped) == "disk quota exceeded"
    try:
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError as inner:
            raise RuntimeError("bundle failed") from inner
    except RuntimeError as outer:
        assert storage_full(outer) == "file too large"
    assert storage_full(MmlinksError("image: too_large: file too large for the store")) is None
    assert storage_full(OSError(errno.EACCES, "Permission denied")) is None
