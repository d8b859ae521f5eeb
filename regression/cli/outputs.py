"""What the command line writes: the report on stdout (errors on stderr), and the ``--json``
and ``--html`` files, each checked before anything runs and written whole or not at all."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import store
from ..constants import PARTIAL_NOTE
from ..report import Report, html, render, write_json

# `report` lists at most this many rows, the worst failing first, as the failing check did.
REPORT_ROWS = 20


def print_report(report: Report, *, timing: bool, json_path: str | None,
                 limit: int | None = None) -> None:
  """Prints a command's report: the stamp (``info``), the error on stderr, or the table."""
  if report.command == "info":
    from ..stamp import format_stamp

    print(format_stamp(report.stamp or {}))
    return
  if report.error:
    print(f"error: {report.error}", file=sys.stderr)
    return
  print(render(report, timing=timing, json_path=json_path, limit=limit))
  if report.command == "record" and report.exit_code == 0:
    partial = any(note.startswith(PARTIAL_NOTE) for note in report.notes)
    print(f"\nwrote baseline {report.baseline} ({len(report.rows)} cases"
          f"{' recorded: see the note above' if partial else ''})")


def write_json_file(report: Report, path: str | None) -> bool:
  """Writes ``--json`` (if given); False, with one line on stderr, when it cannot."""
  if path is None:
    return True
  try:
    write_json(report, path)
  except OSError as e:
    print(f"error: --json {path}: could not write it ({e.strerror or e}); any earlier file "
          "there is unchanged.", file=sys.stderr)
    return False
  return True


def outputs_problem(args: argparse.Namespace) -> str | None:
  """Why ``--json`` or ``--html`` cannot be written (one line), found before anything runs."""
  json_path, html_path = getattr(args, "json", None), getattr(args, "html", None)
  if json_path is not None:
    problem = _output_problem("--json", json_path)
    if problem:
      return problem
  if html_path is not None:  # a rehearsal draws its page in its own environment
    return html_problem(html_path, json_path, here=args.command != "rehearse")
  return None


def _output_problem(flag: str, path: str) -> str | None:
  """Why the file ``path`` that ``flag`` names cannot be written, or None."""
  out = Path(path)
  if out.is_dir():
    return f"{flag} {path}: is a directory; name the file to write."
  if not out.parent.is_dir():
    return f"{flag} {path}: directory {out.parent} does not exist."
  if not os.access(out.parent, os.W_OK | os.X_OK):
    return f"{flag} {path}: directory {out.parent} is not writable."
  return store.inside_baseline_problem(flag, path)


def html_problem(path: str, json_path: str | None, *, here: bool = True) -> str | None:
  """Why ``--html path`` cannot be written (one line), found before the batch runs.

  ``here``: the page is drawn in this process, which then needs matplotlib.
  """
  if here and not html.available():
    return html.MISSING
  problem = _output_problem("--html", path)
  if problem:
    return problem
  if json_path is not None and Path(json_path).resolve() == Path(path).resolve():
    return f"--html and --json name the same file ({path}); give each its own."
  return None
