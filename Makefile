# Benchmarks and tests; see BENCHMARKS.md and run-tests.sh.
PYTHON ?= python3

.PHONY: bench bench-quick bench-smoke test fuzz

# Full run (< 15 min on 2 cores): rewrites BENCHMARKS.md and bench/plots/.
bench:
	$(PYTHON) -m bench

# Smaller sizes (< 2 min): writes bench/results/quick.md.
bench-quick:
	$(PYTHON) -m bench --quick

# Tiny sizes, checks that every suite runs: writes bench/results/smoke.md.
bench-smoke:
	$(PYTHON) -m bench --smoke

test:
	./run-tests.sh

# The storage core's libFuzzer harnesses, FUZZ_SECONDS each (default 10 min);
# new corpus entries go to fuzz/core/work/, crashes to fuzz/core/crashes/.
FUZZ_SECONDS ?= 600
fuzz:
	fuzz/core/run.sh $(FUZZ_SECONDS)
