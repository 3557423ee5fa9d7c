"""The output folder protocol: staging, ``versions/<version>/``, the manifest-last commit.

A build writes into ``OUT/.staging-<id>/`` (with an owner file, so a later build removes killed
builds' folders), moves the shards to ``OUT/versions/<dataset_version>/`` and writes
``manifest.json`` last: why, a reader sees the old version or the new one, never a mix. Older
versions are pruned; ``build-log.jsonl`` records how each build got its images and features."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator

from pipelines import fault_hooks, fileio
from schemas.errors import MmlinksError
from schemas.manifest import MANIFEST_NAME, Manifest, ShardInfo

VERSIONS_DIR = "versions"
DEAD_LETTER_FILE = "dead_letter.jsonl"
SHARD_INDEX_FILE = "shards.jsonl"
OWNER_FILE = "owner.json"
BUILD_LOG = "build-log.jsonl"
LOCK_FILE = ".commit.lock"
LOCK_TIMEOUT_S = 600.0
# How this run got its inputs (store hits, cache hits) is not part of the dataset: these counters
# go to the build log, so a rebuild from a warm store writes the identical manifest.
RUN_COUNTERS = ("images_fetched", "images_from_store", "features_cached", "features_computed")


def open_staging(out: str) -> str:
    """Create ``out`` and a fresh staging folder in it (removing killed builds' ones first)."""
    if "://" not in out:
        from pathlib import Path

        if Path(out).exists() and not Path(out).is_dir():
            raise MmlinksError(f"{out} exists and is not a directory")
    fileio.mkdirs(out)
    _remove_abandoned_staging(out)
    staging = fileio.join(out, f".staging-{uuid.uuid4().hex[:8]}")
    fileio.mkdirs(fileio.join(staging, "shards"))
    fileio.write_bytes_atomic(fileio.join(staging, OWNER_FILE), json.dumps(_owner()).encode())
    return staging


def read_shard_index(staging: str) -> list[ShardInfo]:
    """The shards the pipeline wrote into ``staging``, sorted by path."""
    index = fileio.read_bytes(fileio.join(staging, SHARD_INDEX_FILE)).decode()
    return sorted(
        (ShardInfo(**json.loads(line)) for line in index.splitlines() if line.strip()),
        key=lambda s: s.path,
    )


def sort_dead_letters(staging: str) -> None:
    """Rewrite the staged dead letters in sorted line order.

    Beam writes them in the order its bundles finish, which depends on the runner (the
    multi-process DirectRunner's two workers interleave differently from the in-process one, and
    a rerun after a killed worker again differently); sorted, a rerun's file is the fault-free
    build's byte for byte. Read whole on the driver, like the shard index: dead letters are
    records of what was dropped, a small part of a build's output.
    """
    path = fileio.join(staging, DEAD_LETTER_FILE)
    if not fileio.exists(path):
        return
    lines = fileio.read_bytes(path).splitlines()
    fileio.write_bytes_atomic(path, b"".join(line + b"\n" for line in sorted(lines) if line.strip()))


def version_dir(version: str) -> str:
    """A version's folder, relative to the output folder (as the manifest names its files)."""
    return f"{VERSIONS_DIR}/{version}"


def commit_version(out: str, staging: str, manifest: Manifest, shards: list[ShardInfo]) -> None:
    """Move the staged files to their version folder, then write the manifest (the commit)."""
    commit_files(out, staging, manifest.dataset_version, [s.path for s in shards], manifest.to_json())


def commit_files(out: str, staging: str, version: str, shard_names: list[str], manifest_json: str) -> None:
    """The commit of any versioned output (dataset shards, link shards): staged shards and the
    dead-letter file to ``versions/<version>/``, then ``OUT/manifest.json`` last. The manifest
    must name its version under the key ``dataset_version`` or ``link_version``.

    Commits into one local folder are serialised (``output_lock``): two builds racing into the
    same output both commit, one after the other, and neither prunes or replaces the version the
    other is moving. A rerun of the committed version (same bytes, so the same version manifest)
    leaves its folder in place instead of deleting what readers of the current manifest read,
    unless a file of it no longer holds the staged bytes (a shard damaged or lost since its commit):
    then the folder is rewritten from the staging. A commit that fails before the manifest is
    written removes the version folder it was filling.
    """
    target = fileio.join(out, version_dir(version))
    version_manifest = fileio.join(target, MANIFEST_NAME)
    with output_lock(out):
        staged = [(fileio.join(staging, "shards", n), fileio.join(target, n)) for n in shard_names]
        staged.append((fileio.join(staging, DEAD_LETTER_FILE), fileio.join(target, DEAD_LETTER_FILE)))
        if not _same_bytes(version_manifest, manifest_json) or not all(_same_file(a, b) for a, b in staged):
            fileio.delete_tree(target)  # a same-version leftover (e.g. an interrupted earlier commit)
            try:
                fileio.mkdirs(target)
                for name in shard_names:
                    fileio.rename(fileio.join(staging, "shards", name), fileio.join(target, name))
                fileio.rename(fileio.join(staging, DEAD_LETTER_FILE), fileio.join(target, DEAD_LETTER_FILE))
                fileio.write_bytes_atomic(version_manifest, manifest_json.encode())
            except BaseException:
                fileio.delete_tree(target)  # no half-filled version folder is left behind
                raise
        fault_hooks.reached("commit")
        previous = _current_version(out)
        fileio.write_bytes_atomic(fileio.join(out, MANIFEST_NAME), manifest_json.encode())  # commit
        _prune_versions(out, keep={version, previous} - {None})


def _same_file(staged: str, committed: str) -> bool:
    """Whether ``committed`` holds ``staged``'s bytes (compared by sha256, streamed)."""
    try:
        return fileio.exists(committed) and _sha256(staged) == _sha256(committed)
    except OSError:
        return False


def _sha256(uri: str) -> str:
    h = hashlib.sha256()
    with fileio.open_read(uri) as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _same_bytes(uri: str, text: str) -> bool:
    try:
        return fileio.exists(uri) and fileio.read_bytes(uri) == text.encode()
    except OSError:
        return False


@contextlib.contextmanager
def output_lock(out: str, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold ``OUT/.commit.lock`` (an exclusive ``flock``) while committing into a local folder.

    A second build waits for the first's commit (seconds: renames and two small writes) and
    then commits its own; after ``timeout_s`` it gives up with a one-line error naming the lock.
    The kernel releases a flock when its process dies, so a SIGKILLed build never leaves a stale
    lock. Object stores have no such lock: racing builds into one ``gs://``/``s3://`` prefix
    are not serialised (documented in docs/reliability.md).
    """
    if not fileio.is_local(fileio.normalize(out)):
        yield
        return
    import fcntl

    path = os.path.join(fileio.normalize(out), LOCK_FILE)
    with open(path, "a+b") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise MmlinksError(
                        f"another build has been committing into {out} for over {timeout_s:.0f} s "
                        f"(it holds {path}); wait for it to finish or build into another --out"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _remove_abandoned_staging(out: str) -> None:
    """Delete staging folders of builds on this host whose process is gone (killed builds).

    Folders of live builds, and of builds on other hosts, are left alone: two builds may share
    an output directory without destroying each other's work.
    """
    me = socket.gethostname()
    for uri in fileio.list_files(fileio.join(out, ".staging-*", OWNER_FILE)):
        try:
            owner = json.loads(fileio.read_bytes(uri))
            if owner["host"] != me:
                continue
            os.kill(int(owner["pid"]), 0)
        except ProcessLookupError:
            fileio.delete_tree(fileio.parent(uri))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge (permission, torn file)


def append_build_log(out: str, version: str, run_counts: dict, seconds: float) -> None:
    entry = {"finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dataset_version": version}
    entry.update(seconds=round(seconds, 1), **{k: run_counts.get(k, 0) for k in RUN_COUNTERS})
    uri = fileio.join(out, BUILD_LOG)
    old = fileio.read_bytes(uri) if fileio.exists(uri) else b""
    fileio.write_bytes_atomic(uri, old + (json.dumps(entry, sort_keys=True) + "\n").encode())


def last_build(out: str) -> dict:
    """The build log's newest entry: how the last build got its images and features."""
    uri = fileio.join(out, BUILD_LOG)
    lines = fileio.read_bytes(uri).decode().splitlines() if fileio.exists(uri) else []
    return json.loads(lines[-1]) if lines else {}


def current_manifest(out: str) -> Manifest | None:
    """The committed manifest of ``out``, or None when there is none (or it is unreadable)."""
    uri = fileio.join(out, MANIFEST_NAME)
    if not fileio.exists(uri):
        return None
    try:
        return Manifest.from_dict(json.loads(fileio.read_bytes(uri)), allow_older=True)
    except (MmlinksError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _current_version(out: str) -> str | None:
    uri = fileio.join(out, MANIFEST_NAME)
    if not fileio.exists(uri):
        return None
    try:
        data = json.loads(fileio.read_bytes(uri))
        return str(data.get("dataset_version") or data["link_version"])
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: nothing to keep for it


def _prune_versions(out: str, keep: set[str]) -> None:
    """Delete version folders other than ``keep`` (the new one and the one it replaced)."""
    for uri in fileio.list_files(fileio.join(out, VERSIONS_DIR, "*", MANIFEST_NAME)):
        v = uri.rstrip("/").split("/")[-2]
        if v not in keep:
            fileio.delete_tree(fileio.join(out, VERSIONS_DIR, v))
