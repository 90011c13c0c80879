#!/usr/bin/env bash
# GPU throughput check: TRLVR and GRPO steps, each arm (engine x arm) in its own process, within a time
# budget (--budget-s, default 540 s); prints tokens/s, step time, the TRLVR / GRPO ratios and achieved / peak
# bandwidth, and leaves OUT/arm_<engine>_<arm>.json per arm and OUT/gpu_check.json (OUT: runs/gpu_check).
#
#   scripts/gpu_check.sh /path/to/Qwen3-0.6B [--steps 3 --prompts 8 --max-new-tokens 512 ...]
#   scripts/gpu_check.sh --random-1.7b      # random Qwen3-1.7B-shaped weights, no download (fits 80 GB)
#   scripts/gpu_check.sh --random-4b        # random Qwen3-4B-shaped weights (~100 GB: an H200)
#   scripts/gpu_check.sh --paper-step       # one GPU's share of a paper step (64 rollouts, 1,024-token cap)
#   scripts/gpu_check.sh --cpu-smoke        # dry run: a tiny random Qwen3 on the CPU (~1 min)
# vLLM arms run where vllm imports (--engines auto); without it the in-process arms run, and it says so.
#
# The interpreter: $PYTHON (default python3; for --cpu-smoke, .venv's where it exists). A virtual environment (or conda env) is used as it is, and so
# is a base interpreter that imports torch and the dependencies; a base interpreter with torch but not the
# dependencies gets a venv (GPU_CHECK_VENV, default .venv) with --system-site-packages (its torch) and a pip
# install of the rest. torch is never installed here: install a CUDA build first. src/ goes on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GPU_CHECK_VENV:-.venv}
if [ -z "${PYTHON:-}" ] && [ -x "$VENV/bin/python" ] && [[ " $* " == *" --cpu-smoke "* ]]; then
  PY="$VENV/bin/python"  # the CPU dry run: the project's environment (scripts/setup.sh's), where there is one
fi

if [ $# -eq 0 ]; then
  sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
  exit 2
fi
ARGS=("$@")
if [ "${1#-}" = "$1" ]; then  # first argument is the model directory
  if [ ! -d "$1" ]; then
    echo "gpu_check: model directory '$1' does not exist" >&2
    exit 2
  fi
  ARGS=(--model "$1" "${@:2}")
fi

if ! command -v "$PY" >/dev/null 2>&1; then
  echo "gpu_check: no interpreter '$PY' (set PYTHON=/path/to/python)" >&2
  exit 2
fi
probe() {  # 0: torch and the dependencies import (prints torch and the device); 3: no torch; 4: a dependency missing
  "$1" - <<'PY'
import sys
try:
    import torch
except Exception as e:
    print(f"gpu_check: {sys.executable} cannot import torch ({e})", file=sys.stderr)
    sys.exit(3)
try:
    import accelerate, numpy, peft, safetensors, tokenizers, transformers, yaml  # noqa: F401
except Exception as e:
    print(f"gpu_check: {sys.executable} lacks a dependency of pyproject.toml ({e})", file=sys.stderr)
    sys.exit(4)
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"gpu_check: {sys.executable}: torch {torch.__version__} (CUDA {torch.version.cuda}), {name}")
PY
}
NO_TORCH="install a CUDA build of torch for it first (https://pytorch.org), or set PYTHON to one that has it"
IN_ENV=$("$PY" -c 'import os, sys; print(int(sys.prefix != sys.base_prefix or bool(os.environ.get("CONDA_PREFIX"))))')
rc=0; probe "$PY" || rc=$?
if [ "$IN_ENV" = 1 ]; then  # a venv or conda env: used as it is, never a venv on top of it
  echo "gpu_check: using $PY (a virtual environment: used as it is)"
  if [ $rc = 3 ]; then echo "gpu_check: $NO_TORCH" >&2; exit 2; fi
  if [ $rc != 0 ]; then echo "gpu_check: pip install the dependencies of pyproject.toml into it" >&2; exit 2; fi
elif [ $rc = 3 ]; then  # a venv on it would not have torch either; torch is never installed here
  echo "gpu_check: $NO_TORCH" >&2
  exit 2
elif [ $rc != 0 ]; then  # a base interpreter with torch: a venv on it sees its torch and takes the rest
  if [ ! -x "$VENV/bin/python" ]; then
    echo "gpu_check: creating $VENV on $PY (with its site-packages, so its torch)"
    "$PY" -m venv --system-site-packages "$VENV"
  fi
  PY="$VENV/bin/python"
  echo "gpu_check: installing the dependencies of pyproject.toml into $VENV (torch as it is)"
  "$PY" -m pip install -q -e . || { echo "gpu_check: pip install -e . failed (offline?); install the dependencies of pyproject.toml" >&2; exit 2; }
  probe "$PY" || exit 2
else
  echo "gpu_check: using $PY"
fi

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
exec "$PY" scripts/gpu_check.py "${ARGS[@]}"
