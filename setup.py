"""Build script: compiles src/macronode.c into rcp11._macronode through cffi,
and src/module.c + src/macronode.c into the Redis module rcp11/rcp11.so."""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
import build_module  # noqa: E402


class BuildExtAndModule(build_ext):
    """build_ext that also builds the Redis module as package data: into
    the build tree for wheels, and next to the sources for editable
    installs (where the cffi extension goes too)."""

    def run(self) -> None:
        super().run()
        built = build_module.build(
            os.path.join(self.build_lib, "rcp11", build_module.MODULE_FILE),
            os.path.join(self.build_temp, "redis_module"),
        )
        if self.inplace:
            package_dir = self.get_finalized_command("build_py").get_package_dir("rcp11")
            self.copy_file(built, os.path.join(package_dir, build_module.MODULE_FILE))

    def get_outputs(self) -> list[str]:
        module = os.path.join(self.build_lib, "rcp11", build_module.MODULE_FILE)
        return [*super().get_outputs(), module]


setup(
    cffi_modules=["src/build_macronode.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtAndModule},
)
