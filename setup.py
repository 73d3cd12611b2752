"""Build script: compiles src/macronode.c into rcp11._macronode through cffi."""

from setuptools import setup

setup(cffi_modules=["src/build_macronode.py:ffibuilder"])
