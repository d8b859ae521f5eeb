"""pip's and uv's failures in one line: what they could not install, and why.

``pip install`` prints its resolver's story over many lines. :func:`pip_failure` keeps
the line that says why (no matching distribution; the conflict, less the lines that are
not part of it; else pip's last error) and names the requirement it concerns. A conflict
with one of this environment's pins says so and what to do: name a version of that
package too, or pass ``--resolve`` (:mod:`nnx_pool.regression.upgrade.rehearse_plan`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .rehearse_plan import SELF, Requirement, admits, normalise

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def pip_failure(output: str, requirements: Sequence[str], pins: Mapping[str, str], *,
                resolve: bool = False) -> str:
  """The one line that says why pip failed, naming the requirement it could not install.

  Args:
    output: pip's stdout and stderr.
    requirements: what the user asked for.
    pins: this environment's versions, to say when one of them is in the way.
    resolve: whether ``--resolve`` was given (else a dependent in the way suggests it).
  """
  lines = [line.strip() for line in output.splitlines()]
  errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR: ")]
  causes: list[str] = []
  if "The conflict is caused by:" in lines:
    for line in lines[lines.index("The conflict is caused by:") + 1:]:
      if not line:
        break
      causes.append(line)
  missing = [e for e in errors if e.startswith("No matching distribution found")]
  if causes:
    reason = _conflict(causes, pins, resolve)
  elif missing:
    reason = missing[-1]
  elif errors:
    useful = [e for e in errors if not e.startswith("ResolutionImpossible")]
    reason = (useful or errors)[-1]
  else:
    reason = next((line for line in reversed(lines) if line), "pip failed without a message")
  reason = re.sub(r"\s*\(from versions: [^)]*\)", "", " ".join(reason.split()))
  mentioned = {normalise(t) for t in _TOKEN.findall(reason)}
  which = [r for r in requirements if Requirement.parse(r).name in mentioned or r in reason]
  if not which:
    which = [SELF] if SELF in mentioned or "nnx_pool" in reason else list(requirements)
  return f"rehearse: pip could not install {' '.join(which)}: {reason}"


def _conflict(causes: Sequence[str], pins: Mapping[str, str], resolve: bool) -> str:
  """pip's "The conflict is caused by" lines, less those that are not the conflict, with hints."""
  requested = dict(re.findall(r"^The user requested ([A-Za-z0-9._-]+)==(\S+)$",
                              "\n".join(causes), re.M))
  parts, hints = [], []
  for cause in causes:
    depends = re.match(r"(\S+) (\S+) depends on ([A-Za-z0-9._-]+)(\[[^\]]*\])?(\S*)$", cause)
    pinned = re.match(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==(\S+)", cause)
    if cause.startswith("The user requested") and not pinned:
      continue  # what the user asked for, said again
    if depends and admits(depends.group(5), requested.get(depends.group(3))):
      continue  # a dependent that accepts the requested version is not the conflict
    parts.append(cause)
    if depends and pins.get(normalise(depends.group(1))) == depends.group(2):
      name, version = depends.group(1), depends.group(2)
      hints.append(f"{name} {version} is this environment's version; name a {name} version "
                   + ("too" if resolve else "too, or pass --resolve to let pip choose one"))
    elif pinned:
      hints.append(f"{pinned.group(1)} {pinned.group(2)} is this environment's version; "
                   f"name a {pinned.group(1)} version too")
  return "; ".join(parts) + (f" ({'; '.join(hints)})" if hints else "")


def uv_failure(output: str, requirements: Sequence[str], pins: Mapping[str, str] | None = None,
               *, resolve: bool = False) -> str:
  """The one line that says why ``uv pip`` failed: its resolver's reason (what follows
  ``cause:``, or ``╰─▶`` on a terminal), else its last ``error:``, naming the requirement it
  could not install; a version of this environment's in the way says so and what to do."""
  lines = output.splitlines()
  start = next((i for i, line in enumerate(lines)
                if "╰─▶" in line or line.strip().startswith("cause:")), None)
  if start is not None:
    first = lines[start]
    reason = [first.split("╰─▶", 1)[1] if "╰─▶" in first else first.strip()[len("cause:"):]]
    for line in lines[start + 1:]:
      if not line.strip() or line.strip().startswith(("hint:", "help:")):
        break
      reason.append(line)
    text = " ".join(" ".join(reason).split())
  else:
    errors = [line.strip().removeprefix("error:").strip() for line in lines
              if line.strip().startswith("error:")]
    text = errors[-1] if errors else next((line.strip() for line in reversed(lines)
                                           if line.strip()), "uv failed without a message")
  hints = []
  for name, version in re.findall(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?),? depends on", text):
    if (pins or {}).get(normalise(name)) == version and normalise(name) != SELF:
      hints.append(f"{name} {version} is this environment's version; name a {name} version "
                   + ("too" if resolve else "too, or pass --resolve to let it choose one"))
  mentioned = {normalise(t) for t in _TOKEN.findall(text)}
  which = [r for r in requirements if Requirement.parse(r).name in mentioned or r in text]
  return (f"rehearse: uv could not install {' '.join(which or requirements)}: {text}"
          + (f" ({'; '.join(dict.fromkeys(hints))})" if hints else ""))
