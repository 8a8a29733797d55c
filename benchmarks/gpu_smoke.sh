#!/usr/bin/env bash
# One prepared learner check for a GPU machine, run from a checkout; finishes in well under
# 10 minutes on one H100/H200-class GPU.
#
#   bash benchmarks/gpu_smoke.sh                 # on the GPU machine
#   ECHO2_SMOKE_CPU=1 bash benchmarks/gpu_smoke.sh   # the same script on a CPU box, tiny sizes
#
# What it runs, with the Qwen3-0.6B architecture (random init, no download):
# 1. benchmarks/learner_memory.py: B = 128 completions of 1,024 tokens (plus 64 prompt tokens),
#    bf16-mixed precision, 16,384-token micro-batches; and B = 32 beside it, so the JSON shows
#    peak memory does not grow with B on the GPU either -> learner_gpu_smoke.json
# 2. benchmarks/learner_scaling.py: step time of the plain learner and of the FSDP2-sharded one
#    (torchrun, NCCL, bf16 parameters / fp32 reduction) with as many ranks as GPUs; on one GPU the
#    sharded point is FSDP on 1 rank -> learner_scaling_gpu.json (about a minute on an H200)
# 4. benchmarks/engines.py: tokens/s of the hf and vllm engines on 64 prompts x G = 8, 256 new
#    tokens, and the weight-swap time (goal: vllm >= 10x hf) -> engines_gpu.json. vLLM goes in a
#    venv of its own ($VLLM_PYTHON, default /tmp/echo2-vllm: `pip install -e '.[vllm]'`, which
#    brings vLLM's own CUDA torch). Offline without a vLLM wheel, this step is skipped.
# 3. benchmarks/delta_bytes.py: bytes per version of full bf16, delta + zstd and LoRA on a
#    159M-parameter Qwen3 architecture trained 20 steps at lr 1e-6 and 1e-5 on the GPU (the codec
#    runs on the CPUs), under 75 s on an H200 -> delta_bytes_gpu.json. Runs before the engines.
# 5. benchmarks/gpu_learning_run.py: the real-model learning run (configs/smollm2_addition.toml)
#    with learner and workers on the GPU: learner and generation tokens/s, peak memory
#    -> gpu_learning_run.json. Skipped where echo2's run dependencies are not installed. Runs
#    before the engines.
# Files go to $OUT (the device tool's output folder) or to benchmarks/results/.
#
# Dependencies: torch with CUDA (the machine's own if it sees a GPU, else `pip install torch`
# from PyPI, a CUDA build), and echo2's pure-Python dependencies. On a machine with no network,
# bring them as wheels for its Python in ./.whl (`pip download --only-binary=:all: --no-deps
# --python-version 3.12 --platform manylinux2014_x86_64 -d .whl NAME` for pydantic pydantic-core
# annotated-types typing-inspection cryptography cffi pycparser zstandard; peft comes with the
# machine or as a wheel too).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-benchmarks/results}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

if [ "${ECHO2_SMOKE_CPU:-0}" = 1 ]; then
  ARGS=(--arch tiny-wide-vocab --device cpu --precision fp32 --batches 8,32 --completion-tokens 64
        --prompt-tokens 16 --micro-batch-tokens 1024 --logprob-chunk-tokens 256 --modes micro)
  OUT_FILE="$OUT_DIR/learner_gpu_smoke_cpu_path.json"
else
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_smoke: no CUDA torch here; installing one from PyPI" >&2
    "$PY" -m pip install -q torch
  fi
  ARGS=(--arch qwen3-0.6b --device cuda --precision bf16-mixed --batches 32,128 --completion-tokens 1024
        --prompt-tokens 64 --micro-batch-tokens 16384 --modes micro)
  OUT_FILE="$OUT_DIR/learner_gpu_smoke.json"
fi

# echo2's own imports: what is missing comes from ./.whl (offline) or PyPI
NEED="pydantic cryptography safetensors transformers aiohttp"
if ! "$PY" -c "import $(echo $NEED | tr ' ' ',')" 2>/dev/null; then
  if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/echo2-site .whl/*.whl
    export PYTHONPATH="/tmp/echo2-site${PYTHONPATH:+:$PYTHONPATH}"
  else
    "$PY" -m pip install -q "pydantic>=2.7,<3" "cryptography>=42" "safetensors>=0.4" "transformers>=4.51,<6" "aiohttp>=3.9,<4"
  fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'EOF'
import torch
print(f"gpu_smoke: torch {torch.__version__}, cuda available: {torch.cuda.is_available()}",
      f"({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "", flush=True)
EOF
started=$(date +%s)
"$PY" benchmarks/learner_memory.py "${ARGS[@]}" --out "$OUT_FILE"
echo "gpu_smoke: wrote $OUT_FILE in $(( $(date +%s) - started )) s" >&2

# 2. the learner, plain and sharded over the GPUs
if [ "${ECHO2_SMOKE_CPU:-0}" = 1 ]; then
  SCALING_ARGS=(--arch cpu-small --device cpu --precision fp32 --batch 8 --completion-tokens 32 --steps 1)
  SCALING_OUT="$OUT_DIR/learner_scaling_cpu_path.json"
else
  SCALING_ARGS=(--arch qwen3-0.6b --device cuda --precision bf16-mixed --batch 32 --prompt-tokens 64
                --completion-tokens 256 --micro-batch-tokens 4096 --steps 3)
  SCALING_OUT="$OUT_DIR/learner_scaling_gpu.json"
fi
started=$(date +%s)
# a failed point is in the JSON (its `error`); the engines step still runs
"$PY" benchmarks/learner_scaling.py "${SCALING_ARGS[@]}" --out "$SCALING_OUT" >/dev/null \
  || echo "gpu_smoke: learner_scaling had a failed point (see $SCALING_OUT)" >&2
echo "gpu_smoke: wrote $SCALING_OUT in $(( $(date +%s) - started )) s" >&2

# 3. delta and LoRA bytes per version (needs zstandard and peft: from ./.whl when offline)
if ! "$PY" -c "import zstandard, peft" 2>/dev/null; then
  if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/echo2-site .whl/*.whl
    export PYTHONPATH="/tmp/echo2-site${PYTHONPATH:+:$PYTHONPATH}"
  else
    "$PY" -m pip install -q "zstandard>=0.22" "peft>=0.13"
  fi
fi
if [ "${ECHO2_SMOKE_CPU:-0}" = 1 ]; then
  DELTA_ARGS=(--device cpu --hidden 128 --layers 2 --intermediate 256 --heads 2 --kv-heads 1 --head-dim 64
              --vocab 1000 --steps 3)
  DELTA_OUT="$OUT_DIR/delta_bytes_gpu_smoke_cpu_path.json"
else
  DELTA_ARGS=(--device cuda --codecs sub-zstd)  # both codecs: ~100 s; the CPU result compares them
  DELTA_OUT="$OUT_DIR/delta_bytes_gpu.json"
fi
started=$(date +%s)
"$PY" benchmarks/delta_bytes.py "${DELTA_ARGS[@]}" --out "$DELTA_OUT" > /dev/null
echo "gpu_smoke: wrote $DELTA_OUT in $(( $(date +%s) - started )) s" >&2

# 5. the real-model learning run (benchmarks/gpu_learning_run.py): configs/smollm2_addition.toml's
#    settings with the learner (bf16-mixed) and two HF workers on the GPU: learner and generation
#    tokens/s, peak memory. SmolLM2 when runs/.cache holds it (`echo2 models fetch`), else the
#    Qwen3-0.6B architecture, random init (throughput only; the 98 MB file exceeds what the device
#    carries). It needs echo2's full dependencies (`pip install -e .` or wheels in ./.whl).
if [ "${ECHO2_SMOKE_CPU:-0}" = 1 ]; then
  RUN_ARGS=(--device cpu --arch tiny --steps 3 --workers 1 --new-tokens 8)
  RUN_OUT="$OUT_DIR/gpu_learning_run_cpu_path.json"
else
  RUN_ARGS=(--device cuda --arch qwen3-0.6b --steps 10 --workers 2 --new-tokens 64)
  RUN_OUT="$OUT_DIR/gpu_learning_run.json"
fi
if ! "$PY" -c "import echo2.cli.run_cmd, datasets, math_verify, reasoning_gym, tensorboard" 2>/dev/null; then
  echo "gpu_smoke: echo2's run dependencies are missing here (pip install -e . or wheels in .whl); learning run skipped" >&2
else
  started=$(date +%s)
  "$PY" benchmarks/gpu_learning_run.py "${RUN_ARGS[@]}" --out "$RUN_OUT" > /dev/null \
    || echo "gpu_smoke: the learning run failed (see its output above)" >&2
  echo "gpu_smoke: wrote $RUN_OUT in $(( $(date +%s) - started )) s" >&2
fi

# 4. the engines, in a venv with vLLM
if [ "${ECHO2_SMOKE_CPU:-0}" = 1 ]; then
  VPY=${VLLM_PYTHON:-.venv-vllm/bin/python}
  ENGINE_ARGS=(--arch tiny --device cpu --prompts 8 --new-tokens 16 --repeats 1)
  ENGINE_OUT="$OUT_DIR/engines_gpu_smoke_cpu_path.json"
  if ! "$VPY" -c "import vllm" 2>/dev/null; then
    echo "gpu_smoke: no vLLM at $VPY (make test-vllm builds .venv-vllm); engines step skipped" >&2
    exit 0
  fi
else
  VPY=${VLLM_PYTHON:-/tmp/echo2-vllm/bin/python}
  ENGINE_ARGS=(--arch qwen3-0.6b --device cuda --prompts 64 --group-size 8 --new-tokens 256)
  ENGINE_OUT="$OUT_DIR/engines_gpu.json"
  if ! "$VPY" -c "import vllm" 2>/dev/null; then
    echo "gpu_smoke: installing vLLM into $(dirname "$(dirname "$VPY")")" >&2
    "$PY" -m venv "$(dirname "$(dirname "$VPY")")"
    if [ -d .whl ]; then
      INSTALL=("$VPY" -m pip install -q --no-index --find-links .whl -e '.[vllm]')
    else
      INSTALL=("$VPY" -m pip install -q -e '.[vllm]')
    fi
    # a machine with no package index and no vLLM wheel at hand (vLLM's CUDA wheels are
    # hundreds of MB): the learner results above stand, and the engines step says why it is missing
    if ! "${INSTALL[@]}"; then
      echo "gpu_smoke: vLLM could not be installed here (offline, no wheel in .whl); engines step skipped" >&2
      exit 0
    fi
  fi
fi
started=$(date +%s)
"$VPY" benchmarks/engines.py "${ENGINE_ARGS[@]}" --out "$ENGINE_OUT"
echo "gpu_smoke: wrote $ENGINE_OUT in $(( $(date +%s) - started )) s" >&2

