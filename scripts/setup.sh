#!/usr/bin/env bash
# Create .venv (if missing) and install tandem-rlvr with its test extras.
# torch is installed first at the CPU build pinned below, so that pip never pulls a multi-GB CUDA
# build on a machine without a GPU. On a GPU machine, install your CUDA torch into .venv first
# (or set TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0"), then run this script.
# Quiet unless something fails: pip's output goes to a log that is printed only on failure.
# TANDEM_SETUP_QUIET=1 (set by scripts/test.sh) also drops the one-line summary of the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
LOG=$(mktemp "${TMPDIR:-/tmp}/tandem-setup.XXXXXX")
trap 'rm -f "$LOG"' EXIT
quiet() {  # run "$@" with its output in $LOG; on failure show the log and stop
  if ! "$@" >"$LOG" 2>&1; then
    echo "setup failed: $*" >&2
    echo "---- output ----" >&2
    cat "$LOG" >&2
    exit 1
  fi
}
if [ ! -x .venv/bin/python ]; then
  quiet "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  quiet python -m pip install "$TORCH_SPEC"
fi
quiet python -m pip install -c constraints.txt -e ".[test]"
quiet python - <<'PY'
import torch, transformers, accelerate, peft, datasets, math_verify
print(f"tandem-rlvr env: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"accelerate {accelerate.__version__}, peft {peft.__version__}, datasets {datasets.__version__}")
PY
if [ "${TANDEM_SETUP_QUIET:-0}" != 1 ]; then
  cat "$LOG"
fi
