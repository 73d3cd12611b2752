#!/bin/sh
PYTHONPATH=/work/main exec /work/main/.venv/bin/python -m fuzz.proto._atheris raw "$@"
