"""Modules the Python tests need but rdmabuf does not (numpy, torch).

A test file that lacks one is skipped, saying which, on a machine without
it; with RDMABUF_TEST_STRICT=1 (as CI sets it) the file fails instead, so a
run cannot pass having tested nothing.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def module(name: str) -> ModuleType:
    if os.environ.get("RDMABUF_TEST_STRICT") == "1":
        try:
            return importlib.import_module(name)
        except ImportError as e:
            raise ImportError(
                f"RDMABUF_TEST_STRICT=1 and {name} is missing: {e} (install python3-{name})"
            ) from e
    return pytest.importorskip(name, reason=f"{name} is not installed")
