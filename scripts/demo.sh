#!/usr/bin/env bash
# The main job on the built-in default: set up .venv if needed, then run the CPU demo.
# Arguments go to `tandem-rlvr demo` (e.g. --quick, --seeds 1, --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec tandem-rlvr demo "$@"
