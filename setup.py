"""Build hook for the optional C extensions; all other metadata is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and blackbox
uses its pure-Python write path (same bytes, slower ``mark()``) and samples no
allocations (``_csample``: collect/allocs.py says so in one note).
"""

from setuptools import Extension, setup

setup(
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
            optional=True,
            libraries=["m", "dl"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        ),
    ]
)
