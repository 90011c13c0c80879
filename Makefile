.PHONY: setup test test-slow demo demo-quick bench bench-quick fuzz
setup:
	bash scripts/setup.sh
test:
	bash scripts/test.sh
test-slow:
	bash scripts/test.sh -m slow
demo:
	bash scripts/demo.sh
demo-quick:
	bash scripts/demo.sh --quick
bench: setup
	bash benchmarks/run_all.sh
bench-quick: setup
	TANDEM_BENCH_QUICK=1 bash benchmarks/run_all.sh
fuzz: setup
	.venv/bin/python scripts/fuzz_rewards.py --n 10000
.PHONY: test-vllm mutate
test-vllm:
	bash scripts/test_vllm.sh
mutate: setup
	.venv/bin/python -m pip install -q -c constraints.txt -e ".[test,mutate]"
	bash scripts/mutate.sh
