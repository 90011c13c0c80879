#!/usr/bin/env bash
# Create .venv (if missing) and install tandem-rlvr with its test extras.
# torch is installed first at the CPU build pinned below, so that pip never pulls a multi-GB CUDA
# build on a machine without a GPU. On a GPU machine, install your CUDA torch into .venv first
# (or set TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0"), then run this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  python -m pip install -q "$TORCH_SPEC"
fi
python -m pip install -q -c constraints.txt -e ".[test]"
python - <<'PY'
import torch, transformers, accelerate, peft, datasets, math_verify
print(f"tandem-rlvr env: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"accelerate {accelerate.__version__}, peft {peft.__version__}, datasets {datasets.__version__}")
PY
