#!/usr/bin/env bash
# GPU throughput check: 3 TRLVR steps and 3 GRPO steps with a small self-paired Qwen3-family model,
# then tokens/s, step time and the TRLVR / GRPO ratios (also in runs/gpu_check/gpu_check.json).
#
#   scripts/gpu_check.sh /path/to/Qwen3-0.6B [--steps 3 --prompts 8 --max-new-tokens 512 ...]
#   scripts/gpu_check.sh --cpu-smoke          # dry run: a tiny random Qwen3 on the CPU (~1 min)
#   scripts/gpu_check.sh --random-4b --engines hf,vllm   # random Qwen3-4B-shaped weights, no download
#   scripts/gpu_check.sh --paper-step     # one GPU's share of a paper step (64 rollouts x 3,000 tokens), both engines
# Both rollout engines run where vllm imports (--engines auto; pip install vllm into the venv first).
#
# Sized for one GPU with >= 80 GB: about 3-5 minutes with Qwen3-0.6B/1.7B, after the venv exists.
# The venv (GPU_CHECK_VENV, default .venv) is created with --system-site-packages, so a CUDA torch
# that is already installed is used as is; pip only installs what cannot be imported. Offline
# machines: preinstall torch + the dependencies in pyproject.toml; the package itself needs no
# install (scripts/gpu_check.py puts src/ on the path).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GPU_CHECK_VENV:-.venv}

if [ $# -eq 0 ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
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

if [ ! -x "$VENV/bin/python" ]; then
  echo "gpu_check: creating $VENV (with system site-packages)"
  "$PY" -m venv --system-site-packages "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

if ! python -c "import torch" >/dev/null 2>&1; then
  echo "gpu_check: no torch in $VENV; installing the default (CUDA) build from PyPI"
  python -m pip install -q torch || { echo "gpu_check: could not install torch; install a CUDA build first" >&2; exit 2; }
fi
if ! python -c "import transformers, accelerate, peft, yaml, tokenizers, numpy, tqdm" >/dev/null 2>&1; then
  echo "gpu_check: installing tandem-rlvr and its dependencies into $VENV"
  python -m pip install -q -e . || { echo "gpu_check: pip install -e . failed (offline?); install the dependencies of pyproject.toml" >&2; exit 2; }
elif ! python -c "import tandem_rlvr" >/dev/null 2>&1; then
  python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true  # optional: src/ is on the path anyway
fi
python - <<'PY'
import torch
cuda = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if cuda else "no CUDA device"
print(f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}), {name}")
PY

export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
exec python scripts/gpu_check.py "${ARGS[@]}"
