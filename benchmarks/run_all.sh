#!/usr/bin/env bash
# Run every side-by-side benchmark; each appends its lines to benchmarks/RESULTS.md.
#   bash benchmarks/run_all.sh            # full run (~8 min on 2 shared CPU cores)
#   TANDEM_BENCH_QUICK=1 bash benchmarks/run_all.sh   # fewer repeats / sizes (smoke run)
# One script per question; run one alone with: python benchmarks/<script>.py --help
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore
export TANDEM_BENCH_THREADS="${TANDEM_BENCH_THREADS:-1}"
python benchmarks/common.py
for s in p1_tandem_overhead p2_naive_tandem p3_train_step p4_legibility p5_solo_vs_hf p6_lora_memory p7_cpu_loop modes; do
  echo "== $s"
  python "benchmarks/$s.py" 2>&1 | grep -v -e "it/s]" -e "^Loading weights" -e "^Writing model" || { echo "$s failed"; exit 1; }
done
python benchmarks/p2_naive_tandem.py --word-rate 0 2>&1 | grep -e "^P2" || true
echo "== scaling (length)"; python benchmarks/scaling.py --sweep length
echo "== scaling (batch)";  python benchmarks/scaling.py --sweep batch
