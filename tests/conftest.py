"""Test-wide settings: the token cache lives in a temporary folder, never in the user's cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    folder = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("PREFIXCHECK_CACHE_DIR", str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder
