"""Pack the training stack the GPU machine lacks (Ray, MLflow and what they import) into one
archive that travels with the working tree (issue #63).

Why: that machine's image has Python 3.12, PyTorch, CUDA, pandas and pyarrow, but no Ray or MLflow;
nothing can be downloaded there, and what travels is limited to 64 MiB. Ray's wheel alone is 79 MB:
what a training job does not run (its Java jars, RLlib, Serve, the LLM library, the dashboard's web
client) stays behind and the rest is xz-compressed (~40 MB for Python 3.12). Packages and versions
come from ``constraints.txt`` (the lock), so the job there runs the versions CI tests here.
Downloading happens here, at pack time (a build step, like ``make setup``); nothing is fetched there
or in tests. Checked on the CPU too: ``--python 3.11`` unpacked beside a venv holding only the
image's packages runs ``mmlinks train --workers 0`` and ``--workers 1``
(docs/benchmarks-training.md).

    python benchmarks/gpu_stack.py pack                    # here: writes .gpu-stack/stack.tar.xz
    python benchmarks/gpu_stack.py pack --python 3.11      # the same for this machine's Python (a CPU check)
    # there, carrying .gpu-stack:
    mkdir -p /tmp/site && tar -xJf .gpu-stack/stack.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

OUT_DIR = Path(".gpu-stack")
# What `mmlinks train --workers 0|1 --gpu` imports and the GPU image does not hold (read from
# `python -X importtime -m cli train ...` here, less the image's package list in the device
# tool's KINDS.md). Names as constraints.txt spells them.
PACKAGES = (
    "ray", "mlflow-skinny", "mlflow-tracing", "SQLAlchemy", "alembic", "Mako",
    "cachetools", "databricks-sdk", "google-auth", "pyasn1", "pyasn1_modules",
    "fastapi", "starlette", "pydantic", "pydantic_core", "annotated-types", "typing-inspection",
    "GitPython", "gitdb", "smmap", "importlib_metadata", "opentelemetry-api",
    "opentelemetry-sdk", "opentelemetry-proto", "opentelemetry-semantic-conventions",
    "python-dotenv", "sqlparse", "uvicorn", "jsonschema", "jsonschema-specifications",
    "referencing", "rpds-py", "tensorboardX", "cryptography", "cffi", "pycparser",
)  # fmt: skip
# Inside the unpacked packages: what a training job never runs.
DROP = (
    "ray/jars", "ray/rllib", "ray/serve", "ray/llm", "ray/dashboard/client",
    "ray/tests", "ray/_private/runtime_env/agent/thirdparty_files",
)  # fmt: skip
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (34, 28, 27, 24, 17)] + ["manylinux2014_x86_64"]


def pinned(constraints: Path = Path("constraints.txt")) -> dict[str, str]:
    """``name -> version`` from the lock, names folded as pip folds them."""
    pins = {}
    for line in constraints.read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line):
            pins[fold(m[1])] = m[2]
    return pins


def fold(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def download(python: str, wheels: Path) -> list[Path]:
    pins = pinned()
    missing = [n for n in PACKAGES if fold(n) not in pins]
    if missing:
        raise SystemExit(f"not in constraints.txt: {', '.join(missing)}")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp", "-d", str(wheels)]
    cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
    done = subprocess.run(
        [*cmd, *(f"{n}=={pins[fold(n)]}" for n in PACKAGES)], capture_output=True, text=True
    )
    if done.returncode:  # pip's own lines say which package has no wheel for that Python
        raise SystemExit(
            "pip download failed:\n"
            + "\n".join(line for line in done.stderr.splitlines() if "is ignored" not in line)
        )
    return sorted(wheels.glob("*.whl"))


def unpack(wheel: Path, site: Path) -> None:
    """A wheel's files as ``pip install --target`` lays them out (``*.data/purelib|platlib``
    folded into the top; scripts and headers left out: nothing there runs them)."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = Path(info.filename).parts
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            target = site.joinpath(*parts)
            if info.is_dir():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
            if info.external_attr >> 16 & 0o111:  # the raylet and GCS server binaries
                target.chmod(0o755)


def pack(python: str, out_dir: Path = OUT_DIR) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp, "wheels"), Path(tmp, "site")
        found = download(python, wheels)
        wheel_bytes = sum(w.stat().st_size for w in found)
        for wheel in found:
            unpack(wheel, site)
        dropped = {}
        for rel in DROP:
            path = site / rel
            if path.exists():
                dropped[rel] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                shutil.rmtree(path)
        for cache in site.rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)
        unpacked = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
        out_dir.mkdir(exist_ok=True)
        archive = out_dir / "stack.tar.xz"
        with tarfile.open(archive, "w:xz", preset=6) as tar:
            tar.add(site, arcname=".")
    return {
        "python": python,
        "wheels": [w.name for w in found],
        "wheel_bytes": wheel_bytes,
        "unpacked_bytes": unpacked,
        "dropped_bytes": dropped,
        "archive": str(archive),
        "archive_bytes": archive.stat().st_size,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("pack",))
    parser.add_argument(
        "--python", default="3.12", help="the Python version there (default: 3.12, the GPU image's)"
    )
    parser.add_argument(
        "--out", type=Path, default=OUT_DIR, help="where stack.tar.xz goes (default: .gpu-stack)"
    )
    args = parser.parse_args(argv)
    out = pack(args.python, args.out)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
