# Benchmarks and tests; see BENCHMARKS.md and run-tests.sh.
# The checkout's virtual environment when there is one (run-tests.sh makes it).
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)

.PHONY: bench bench-quick bench-smoke test fuzz fuzz-proto fuzz-core fuzz-seeds soak

# Full run (< 15 min on 2 cores): rewrites BENCHMARKS.md and bench/plots/.
bench:
	$(PYTHON) -m bench

# Smaller sizes (< 2 min): writes bench/results/quick.md (not in git).
bench-quick:
	$(PYTHON) -m bench --quick

# Tiny sizes, checks that every suite runs: writes bench/results/smoke.md (not in git).
bench-smoke:
	$(PYTHON) -m bench --smoke

test:
	./run-tests.sh

# The fuzzers, FUZZ_TIME seconds each (CI runs them for a short bounded time),
# starting from the seed sets in fuzz/{core,proto}/corpus/ (in git). The full
# corpus grows outside git: fuzz/proto/runs/<target>/corpus/ and
# fuzz/core/runs/<harness>/; findings land in fuzz/proto/runs/<target>/artifacts/
# and fuzz/core/crashes/. `make fuzz-seeds` folds what the runs found back
# into the seeds, keeping the fewest inputs that reach every edge (fuzz/seeds.py).
FUZZ_TIME ?= 600
fuzz: fuzz-proto fuzz-core

fuzz-proto:
	nice -n 10 $(PYTHON) -m fuzz.proto --time $(FUZZ_TIME)

fuzz-core:
	fuzz/core/run.sh $(FUZZ_TIME)

fuzz-seeds:
	$(PYTHON) -m fuzz.proto --merge
	PYTHON=$(PYTHON) fuzz/core/run.sh 0 --seeds

# Mixed load with kill -9 rounds and a checker (bench/soak.py).
SOAK_TIME ?= 600
soak:
	nice -n 10 $(PYTHON) -m bench.soak --duration $(SOAK_TIME)
