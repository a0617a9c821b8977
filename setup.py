"""Builds headrace's one optional C accelerator; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and ``_shuffle.py`` computes
the same ids in NumPy, only slower (see ``headrace._order.shuffle.accelerated``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("headrace._order._cshuffle", ["src/headrace/_order/_cshuffle.c"], optional=True,
                             extra_compile_args=["-O3"])])
