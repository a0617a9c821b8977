"""Builds headrace's optional C accelerators; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds; ``_order/shuffle.py`` then
computes the same ids in NumPy, ``_store/crc_rows.py`` the same checksums one record per
``google_crc32c`` call and ``_store/snapshot.py`` the same layout scan in NumPy and a parked loader copies its batches in the
consumer's thread (``_store/_copylane.c``), only slower
(see each module's ``accelerated()`` or fallback).
"""

from setuptools import Extension, setup

_CRC = "src/headrace/_store/_crc32c.h"  # the crc32c code both the reader's calls and the lane use

setup(ext_modules=[Extension("headrace._order._cshuffle", ["src/headrace/_order/_cshuffle.c"], optional=True,
                             extra_compile_args=["-O3"]),
                   Extension("headrace._store._crcrows", ["src/headrace/_store/_crcrows.c"],
                             depends=[_CRC], optional=True, extra_compile_args=["-O3"]),
                   Extension("headrace._store._layout", ["src/headrace/_store/_layout.c"],
                             optional=True, extra_compile_args=["-O3"]),
                   Extension("headrace._store._copylane", ["src/headrace/_store/_copylane.c"],
                             depends=[_CRC], optional=True, extra_compile_args=["-O3"])])
