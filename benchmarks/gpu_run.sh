#!/usr/bin/env bash
# The GPU figures docs/benchmarks.md quotes ("On a GPU"), in one run from a checkout on a machine
# with PyTorch + CUDA (+ Triton) but without the pipeline stack (no Ray, Beam, MLflow):
#   OUT=/tmp/gpu PYTHONPATH=.gpu:. bash benchmarks/gpu_run.sh
# .gpu-stack/ (benchmarks/gpu_stack.py pack) holds Ray, MLflow and what they import, for the
# stack_cost step (issue #63); it is unpacked into /tmp/site where present.
# .gpu/ holds the weights that image lacks, packed here by benchmarks/gpu_carry.py (lite0 for the
# extractor step, or minilm for the tower step: not both, the travelling tree is limited to 64 MiB). Each step writes OUT/<name>.json (stderr appended to OUT/errors.log, its
# exit status and seconds to OUT/machine.txt) and the run goes on if one fails, so a single run
# brings back whatever worked. STEPS="assignment step_b11" runs only those.
set -u
OUT=${OUT:-/tmp/gpu}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
if [ -f .gpu-stack/stack.tar.xz ]; then
  mkdir -p /tmp/site && tar -xJf .gpu-stack/stack.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  [ -d /tmp/site/ray ] && python3 -c "import ray, mlflow, sqlalchemy; print('ray', ray.__version__, 'mlflow', mlflow.__version__)"
  nproc
} >"$OUT/machine.txt" 2>&1

step() {  # name timeout_s command...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  case " ${STEPS:-$name} " in *" $name "*) ;; *) return ;; esac
  echo "== $name" >>"$OUT/errors.log"
  timeout "$limit" "$@" >"$OUT/$name.json" 2>>"$OUT/errors.log"
  echo "$name rc=$? $((SECONDS - t0)) s" | tee -a "$OUT/machine.txt"
}

# the kernel's optimum against the host solver on every row, and its time (warps per problem tried)
step assignment 120 python3 benchmarks/assignment.py --device cuda --batch 11 64 --repeats 10 --num-warps 1 2
# issue #5's target on a GPU: AP's training step within 1.15x DC's at B = 11 and B = 64
step step_b11 120 python3 benchmarks/training_step.py --device cuda --batch-docs 11 --repeats 60 --warmup 3
step step_b64 200 python3 benchmarks/training_step.py --device cuda --batch-docs 64 --repeats 25 --warmup 3
# feature extraction: the default extractor's batched forward (Beam half skipped without apache_beam)
step extractor 110 python3 benchmarks/extractor_throughput.py --device cuda --images 2048 --batch-size 64 --rounds 3 --json
# inference of the MiniLM text tower (its float16 copy restored to float32 first)
step minilm_restore 60 python3 benchmarks/gpu_carry.py restore
step minilm 120 python3 benchmarks/tower_inference.py --towers minilm --sentences 4096 --batch 256 --rounds 3 --device cuda
# issue #63: the bare loop on the card against `mmlinks train --workers 0 --gpu` and the Ray Train
# job `--workers 1 --gpu` (MLflow tracking and registration, end to end); needs .gpu-stack
step stack_cost 400 python3 benchmarks/stack_cost.py --device cuda --docs 10000 --epochs 4 --rows bare1,w0,w1,bare2
