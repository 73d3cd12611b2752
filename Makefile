# Benchmarks and tests; see BENCHMARKS.md and run-tests.sh.
# The checkout's virtual environment when there is one (run-tests.sh makes it).
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)

.PHONY: bench bench-quick bench-smoke test fuzz fuzz-proto fuzz-core soak

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

# The fuzzers, FUZZ_TIME seconds each (CI runs them for a short bounded time).
# Python (atheris) findings land in fuzz/proto/runs/<target>/artifacts/; the
# storage core's and the C lane's libFuzzer harnesses put new corpus entries in fuzz/core/runs/
# and crashes in fuzz/core/crashes/.
FUZZ_TIME ?= 600
fuzz: fuzz-proto fuzz-core

fuzz-proto:
	nice -n 10 $(PYTHON) -m fuzz.proto --time $(FUZZ_TIME)

fuzz-core:
	fuzz/core/run.sh $(FUZZ_TIME)

# Mixed load with kill -9 rounds and a checker (bench/soak.py).
SOAK_TIME ?= 600
soak:
	nice -n 10 $(PYTHON) -m bench.soak --duration $(SOAK_TIME)
