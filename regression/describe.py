"""An exception told in one line, as every report of the kit tells one."""

from __future__ import annotations


def error_line(error: BaseException, limit: int | None = None) -> str:
  """``"ValueError: the first line of its message"`` (cut to ``limit`` characters), or
  ``"ValueError: "`` where it has no message."""
  text = str(error).strip()
  first = text.splitlines()[0] if text else ""
  return f"{type(error).__name__}: {first[:limit]}"
