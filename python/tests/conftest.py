"""Checks, before any test, that the installed package is the one this
build made: the suites test what `pip install ./python` put in the venv, and
a stale install would test old code."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import BUILD_DIR  # noqa: E402


def pytest_sessionstart(session):
    import meshplan._meshplan as ext

    built = sorted((BUILD_DIR / "python" / "meshplan").glob("_meshplan*.so"))
    # Installing rewrites the RPATH, so the bytes differ; an install older
    # than the build's module is stale.
    installed = pathlib.Path(ext.__file__).stat().st_mtime
    if built and installed < built[0].stat().st_mtime:
        pytest.exit(
            f"{ext.__file__} is not the extension of {BUILD_DIR}: reinstall it "
            "(make build, or .venv/bin/pip install --no-build-isolation ./python)",
            returncode=2,
        )
