"""A tolerance read back from a manifest, against the one the kit computes now.

``diff`` and ``report`` compare arrays that were recorded earlier. The tolerance a manifest
stores beside an array is a record of the run, not an input: anyone can edit it (an
``atol`` of 1e30 passes any change), so the two commands compute each array's tolerance as
``check`` does and only say where the stored one is looser, naming the array.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .tolerance import Tolerance

# Rules from strictest to loosest: a ``sum`` rule compares totals, ``allclose`` elements.
_RANK = {"exact": 0, "sum": 1, "allclose": 2}

# Relative slack before a stored number counts as looser: JSON round-trips floats exactly,
# but a scale read back from a file may differ from the one a run measured in the last bit.
_SLACK = 1e-6


def looser(stored: Tolerance, tol: Tolerance) -> bool:
  """Whether ``stored`` lets through a difference that ``tol`` does not."""
  if _RANK.get(stored.rule, 3) != _RANK.get(tol.rule, 3):
    return _RANK.get(stored.rule, 3) > _RANK.get(tol.rule, 3)
  return stored.rtol > tol.rtol * (1 + _SLACK) or stored.atol > tol.atol * (1 + _SLACK)


def looser_lines(stored: Mapping[str, Any], used: Mapping[str, Tolerance], where: str,
                 prefix: str = "") -> list[str]:
  """One line for each array whose tolerance stored in ``where`` is looser than the one it
  was compared with (``used``); ``stored`` maps keys to their stored JSON form. A stored
  form that cannot be read is said too."""
  lines = []
  for key, tol in used.items():
    if key not in stored:
      continue
    try:
      old = Tolerance.from_json(stored[key])
    except (KeyError, TypeError, ValueError) as e:
      lines.append(f"`{prefix}{key}`: the tolerance stored in {where} cannot be read "
                   f"({type(e).__name__}); compared with {tol.describe()}, the kit's")
      continue
    if looser(old, tol):
      lines.append(f"`{prefix}{key}`: the tolerance stored in {where} ({label(old)}) is "
                   f"looser than the one for its dtype and scale ({label(tol)}): compared "
                   "with the latter")
  return lines


def label(tol: Tolerance) -> str:
  """``rtol=... atol=...`` with enough digits to show what an edit changed."""
  if tol.rule != "allclose":
    return tol.describe()
  return f"rtol={tol.rtol:.3g} atol={tol.atol:.3g}"
