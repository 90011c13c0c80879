#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the fast test suite (slow tests: add -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM_SETUP_QUIET=1 bash scripts/setup.sh  # silent unless the setup fails (then it shows pip's log)
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One pytest-xdist worker per core, at most 2 (the tests pin one torch thread each; the multi-process tests
# start their own processes), each test file on one worker (its module and session fixtures, a world's
# measured properties or a whole demo, are built once); TANDEM_TEST_WORKERS=0 runs them in this process.
WORKERS=${TANDEM_TEST_WORKERS:-auto}
if [ "$WORKERS" = 0 ]; then
  exec python -m pytest "$@"
fi
exec python -m pytest -n "$WORKERS" --maxprocesses 2 --dist loadfile "$@"
