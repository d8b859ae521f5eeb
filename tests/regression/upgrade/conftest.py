"""The upgrade room's tests: pip builds their stand-in environments (whose fake interpreter
plays pip), unless a test chooses uv; the real-wheel tests (``rehearsal``) use what is here."""

import pytest


@pytest.fixture(autouse=True)
def _installer_pip(request, monkeypatch):
  if request.node.get_closest_marker("rehearsal") is None:
    monkeypatch.setenv("NNX_POOL_INSTALLER", "pip")
