"""Digests of a packaged model's artifact files, recorded when it is logged and verified on every
load (issue #62).

Why: a model damaged in place may still load and score at chance, and ``promote`` once moved
``production`` to such a version. Each ``log_model`` records every file's sha256 in the pyfunc's
``model_config`` and each ``load_context`` checks them first, refusing in one line naming the
file; older versions without digests load as before. hashlib, as the shards are checked."""

from __future__ import annotations

import hashlib
from pathlib import Path

from schemas.errors import MmlinksError

DIGESTS_KEY = "mmlinks_artifact_sha256"  # the pyfunc model_config key holding the digests


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: Path) -> dict[str, Path]:
    """Relative path -> file, for an artifact that is one file ("") or a folder."""
    if root.is_file():
        return {"": root}
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def artifact_digests(artifacts: dict[str, str]) -> dict[str, str | dict[str, str]]:
    """{artifact name: sha256 of a single file, or {relative path: sha256} of a folder's files},
    as ``mlflow.pyfunc.log_model(artifacts=...)`` is about to copy them. MLflow also logs the
    model_config as run parameters, flattened with "/": a single file's digest under a key of its
    own (``DIGESTS_KEY/vocab``), since "DIGESTS_KEY/vocab/" is no valid parameter name and one
    such key made MLflow log none of them ("Failed to log model config as params")."""
    out: dict[str, str | dict[str, str]] = {}
    for name, path in artifacts.items():
        files = {rel: file_sha256(p) for rel, p in _files(Path(path)).items()}
        out[name] = files[""] if set(files) == {""} else files
    return out


def model_config(artifacts: dict[str, str]) -> dict:
    """The ``model_config`` a family's ``log_model`` passes: the artifacts' digests."""
    return {DIGESTS_KEY: artifact_digests(artifacts)}


def verify_artifacts(artifacts: dict[str, str], model_config: dict | None) -> None:
    """Refuse, naming the file, an artifact file that is missing or whose sha256 differs from the
    one recorded when the model was logged; nothing to check for a model logged without them."""
    recorded = (model_config or {}).get(DIGESTS_KEY)
    if not recorded:
        return
    for name, files in recorded.items():
        if isinstance(files, str):  # a single file's digest
            files = {"": files}  # as versions registered before 2026-11-28 record it
        if name not in artifacts:
            raise MmlinksError(f"damaged model: its artifact {name!r} is missing")
        root = Path(artifacts[name])
        for rel, digest in files.items():
            path = root / rel if rel else root
            shown = f"{name}/{rel}" if rel else name
            if not path.is_file():
                raise MmlinksError(f"damaged model: {shown} is missing ({path})")
            if file_sha256(path) != digest:
                raise MmlinksError(
                    f"damaged model: {shown} differs from the file registered with it (sha256 mismatch: "
                    f"{path}); re-register the model from its run or restore the file"
                )
