"""``benchmarks/gpu_stack.py`` (issue #63): what it packs for the GPU machine is pinned in the
lock, and a wheel is laid out as ``pip install --target`` lays it out. The download itself needs
PyPI and is not run here."""

from __future__ import annotations

import importlib.util
import stat
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# by path: an installed dependency ships a top-level ``benchmarks`` package of its own
_SPEC = importlib.util.spec_from_file_location("gpu_stack", ROOT / "benchmarks" / "gpu_stack.py")
gpu_stack = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_stack)


def test_every_packed_package_has_its_version_in_the_lock():
    pins = gpu_stack.pinned(ROOT / "constraints.txt")
    assert [n for n in gpu_stack.PACKAGES if gpu_stack.fold(n) not in pins] == []
    assert pins["ray"] and pins["mlflow-skinny"] and gpu_stack.fold("SQLAlchemy") == "sqlalchemy"


def test_a_wheel_is_unpacked_as_pip_lays_it_out(tmp_path):
    wheel = tmp_path / "demo-1.0-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/__init__.py", "X = 1\n")
        binary = zipfile.ZipInfo("demo/core/server")
        binary.external_attr = (stat.S_IFREG | 0o755) << 16
        zf.writestr(binary, b"\x7fELF")
        zf.writestr("demo-1.0.data/purelib/demo_extra.py", "Y = 2\n")
        zf.writestr("demo-1.0.data/scripts/demo-cli", "#!/bin/sh\n")
        zf.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
    site = tmp_path / "site"
    gpu_stack.unpack(wheel, site)
    files = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert files == ["demo-1.0.dist-info/METADATA", "demo/__init__.py", "demo/core/server", "demo_extra.py"]
    assert (site / "demo/core/server").stat().st_mode & 0o111  # the raylet must stay runnable
