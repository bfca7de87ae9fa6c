"""Where the tests find what the build made: $DDT_BUILD_DIR and the `ddtree` binary in it.
Missing pieces fail the test (never skip)."""

import os

import pytest


def build_dir():
    d = os.environ.get("DDT_BUILD_DIR")
    if not d:
        pytest.fail("DDT_BUILD_DIR is not set: run DDT_BUILD_DIR=<cmake build folder> "
                    "python3 -m pytest tests/python", pytrace=False)
    if not os.path.isdir(d):
        pytest.fail(f"DDT_BUILD_DIR={d} is not a folder", pytrace=False)
    return os.path.abspath(d)


def ddtree_path():
    p = os.path.join(build_dir(), "ddtree")
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        pytest.fail(f"{p} is missing or not executable: build the 'ddtree_cli' target", pytrace=False)
    return p
