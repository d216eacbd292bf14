"""Build hook for the optional C extensions and for ``blackbox-run.pth``; all other metadata is in
pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and blackbox
uses its pure-Python write path (same bytes, slower ``mark()``) and samples no
allocations (``_csample``: collect/allocs.py says so in one note).

``blackbox-run.pth`` goes at the top of the install (site-packages), where Python reads it at start-up: a
Python process of a ``blackbox run`` job whose PYTHONPATH the job replaced (``PYTHONPATH=src python
train.py``) arms through it (``blackbox/run/bootstrap.py``, "A job that sets PYTHONPATH"). An editable
install has none.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        pth = os.path.join("blackbox", "run", "blackbox-run.pth")
        self.copy_file(pth, os.path.join(self.build_lib, "blackbox-run.pth"))


setup(
    cmdclass={"build_py": BuildPyWithPth},
    ext_modules=[
        Extension(
            "blackbox.ring._cwriter",
            sources=["blackbox/ring/_cwriter.c"],
            optional=True,
            libraries=["dl"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        ),
        Extension(
            "blackbox.collect._csample",
            sources=["blackbox/collect/_csample.c"],
            depends=["blackbox/collect/_own_heap.h"],
            optional=True,
            libraries=["m", "dl"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        ),
    ]
)
