#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the fast test suite (slow tests: add -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM_SETUP_QUIET=1 bash scripts/setup.sh  # silent unless the setup fails (then it shows pip's log)
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python -m pytest "$@"
