"""rcp11 benchmark suites: `python -m bench --help`.

Suites live in their own modules with a `run(ctx) -> SuiteReport` function;
the storage-core and persistence suites (bench/core_bench.py,
bench/persistence_bench.py) are called through `run(...)` or `main(argv)`,
whichever they define (see bench/__main__.py, run_external).
"""
