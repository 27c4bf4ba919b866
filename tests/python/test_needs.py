"""needs.module: a missing test dependency skips, or fails under RDMABUF_TEST_STRICT=1."""

from __future__ import annotations

import needs
import pytest


def test_a_missing_module_skips_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RDMABUF_TEST_STRICT", raising=False)
    with pytest.raises(pytest.skip.Exception, match="rdmabuf_no_such_module is not installed"):
        needs.module("rdmabuf_no_such_module")


def test_a_missing_module_fails_when_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMABUF_TEST_STRICT", "1")
    with pytest.raises(ImportError, match="RDMABUF_TEST_STRICT=1 and rdmabuf_no_such_module"):
        needs.module("rdmabuf_no_such_module")


def test_a_present_module_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMABUF_TEST_STRICT", "1")
    assert needs.module("json").dumps([1]) == "[1]"
