"""A griffe extension: nnx_pool's docstrings as the site renders them.

The docstrings are written for ``help()`` and doctest, in the reStructuredText habits of the
scientific Python stack; the site renders Markdown. Two things would be lost:

* a docstring completed at import time (``nnx_pool._pool._document`` appends each window
  pool's ``Args:`` from one table) is read from the imported object, not from the source;
* a literal block (``Example usage::`` then an indented ``>>>`` session, or an RST table
  between ``====`` rules) becomes a fenced code block instead of running text.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

_DOCTEST = re.compile(r"^\s*>>>")


def _runtime_doc(obj: griffe.Object) -> str | None:
  """``obj``'s docstring as Python sees it after import, or None."""
  try:
    value: Any = importlib.import_module(obj.module.path)
    for part in obj.path.removeprefix(obj.module.path + ".").split("."):
      value = getattr(value, part)
  except (ImportError, AttributeError):
    return None
  doc = getattr(value, "__doc__", None)
  return inspect.cleandoc(doc) if isinstance(doc, str) else None


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


def markdown_literals(text: str) -> str:
  """``text`` with RST literal blocks and simple tables as fenced code blocks."""
  lines = text.splitlines()
  out: list[str] = []
  i = 0
  while i < len(lines):
    line = lines[i]
    if re.match(r"^\s*=+( +=+)+\s*$", line):  # an RST simple table: up to its third rule
      end, rules = i, 0
      while end < len(lines) and rules < 3:
        rules += bool(re.match(r"^\s*=+( +=+)+\s*$", lines[end]))
        end += 1
      out += ["```text", *lines[i:end], "```"]
      i = end
      continue
    if line.rstrip().endswith("::") and not line.strip().startswith(".."):
      base = _indent(line)
      j = i + 1
      while j < len(lines) and not lines[j].strip():
        j += 1
      end = j
      while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
      while end > j and not lines[end - 1].strip():
        end -= 1
      if end > j:
        block = lines[j:end]
        cut = min(_indent(b) for b in block if b.strip())
        language = "pycon" if _DOCTEST.match(block[0]) else "python"
        stripped = line.rstrip()[:-2].rstrip()
        out.append(" " * base + stripped + ":" if stripped.strip() else "")
        out += ["", " " * base + f"```{language}", *(" " * base + b[cut:] for b in block),
                " " * base + "```", ""]
        i = end
        continue
    out.append(line)
    i += 1
  return "\n".join(out)


class MarkdownDocstrings(griffe.Extension):
  """Runtime docstrings where import completed them, and RST literal blocks as code."""

  def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
    if obj.docstring is None:
      return
    if obj.is_class:
      runtime = _runtime_doc(obj)
      if runtime and runtime != obj.docstring.value:
        obj.docstring.value = runtime
    obj.docstring.value = markdown_literals(obj.docstring.value)
