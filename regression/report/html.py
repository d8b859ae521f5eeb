"""``check --html OUT``: the report as one self-contained HTML page.

The page holds the user's tests' result where ``rehearse --pytest`` ran them (the command,
its exit status, the tests by outcome, the ids that failed), the verdict, then what changed
first about a user's model (the failure's cause, its state's schema, its modes, its weights,
the first submodule whose output moved: the report's headline, its first :data:`HEAD_LINES`
lines; a renamed model's schema list can be longer, and its rest comes after the table), the
table the CLI prints (one line per case, so a passing case takes one line; failures first,
in the order of :data:`ORDER`), both environments' stamps side by side (changed values
marked), and a section for every failing case, in the same order: its details and, for a
failing array, one figure of three heatmaps, the baseline, the new result
and ``|new - baseline|``, with the cells over tolerance outlined and the tolerance in the
caption. Index and other integer results show the cells that differ instead of a difference.
At most :data:`MAX_FIGURES` arrays are drawn in all: first one of every failing case, the cases
whose worst element is furthest off (:func:`~.text.excess`) first, then further arrays of
those cases; the others are named in their case's details. An array whose dtype or shape
changed is named, not drawn.

Each heatmap shows one 2-D slice, named in its caption: the spatial map through
the worst failing element (the one with the largest ``|difference|``), so at
that element's sample and channel, and for 3-D maps at its depth. A 1-D map is
drawn as a 1 x L strip. An array without the input's layout (a parameter
gradient, a flattened output) shows its last two axes.

The images are PNG data URIs drawn by matplotlib's Agg canvas through its object
API (no pyplot state). The page has no script and loads nothing. matplotlib is
the optional extra ``report`` (``pip install 'nnx-pool[report]'``), imported
only when a page is drawn; :func:`available` says whether it can be.
"""

from __future__ import annotations

import base64
import html
import io
import os
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..compare import failing_elements
from ..compare.tolerance import is_float
from ..stamp import stamp_header, stamp_rows
from ..store import write_atomic
from .data import FAILING, FailedArray, Report, Row
from .text import COLUMNS, aligned, excess, table, timing_lines

INSTALL = "pip install 'nnx-pool[report]'"
MISSING = f"--html needs matplotlib: {INSTALL}"
# The page lists cases by status in this order, the batch's order within a status: what
# moved first, then what could not run, then what must be re-recorded, then the rest.
ORDER = ("FAIL", "ERROR", "STALE", "NEW", "GONE", "PASS", "RECORDED")
# Arrays drawn on one page, at most (about 25 KB of page and 0.2 s each).
MAX_FIGURES = 48
# Lines of the headline (what changed about a user's model) shown before the table.
HEAD_LINES = 8
# Slices up to this many rows and columns get their integer values written in the cells.
_ANNOTATE = 12
_DPI = 90
_BAD = "#c8c8c8"  # NaN and +-inf cells
_OUTLINE = "#00a2ff"  # visible on white and on the darkest red

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; color: #1d1d1f; margin: 24px auto;
       max-width: 1000px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 16px; margin: 22px 0 6px; }
pre, code, td.v { font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
pre { background: #f6f6f8; padding: 8px 10px; overflow-x: auto; margin: 6px 0; }
table.stamp { border-collapse: collapse; }
table.stamp td, table.stamp th { padding: 1px 12px 1px 0; text-align: left;
                                 vertical-align: top; }
table.stamp tr.changed td { background: #fff2c2; }
.PASS, .RECORDED { color: #1a7f37; } .FAIL, .ERROR { color: #c62828; font-weight: 600; }
.NEW, .GONE, .STALE { color: #9a5b00; font-weight: 600; }
ul.details { margin: 4px 0 8px; padding-left: 20px; }
ul.details li { font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace;
                white-space: pre-wrap; }
figure { margin: 10px 0 20px; } figure img { max-width: 100%; display: block; }
figcaption { font-size: 13px; color: #444; max-width: 900px; }
p.muted { color: #666; } h3 .muted { color: #666; font-weight: normal; font-size: 14px; }
"""

Progress = Callable[[int, int, str], None]


def available() -> bool:
  """Whether matplotlib imports (the ``report`` extra is installed)."""
  try:
    import matplotlib  # noqa: F401 - only whether it imports
  except ImportError:
    return False
  return True


def write_html(report: Report, path: str | os.PathLike, *, progress: Progress | None = None
               ) -> None:
  """Renders ``report`` (:func:`render_html`) and writes it atomically to ``path``.

  Raises:
    ImportError: matplotlib is missing (:data:`MISSING` says what to install).
    OSError: the file could not be written; an earlier file at ``path`` is untouched.
  """
  write_atomic(path, render_html(report, progress=progress).encode("utf-8"))


def render_html(report: Report, *, progress: Progress | None = None) -> str:
  """The page for a ``check`` (or ``diff``) report.

  Args:
    report: the report; ``check`` keeps each failing array on its row
      (:attr:`~nnx_pool.regression.report.Row.failed`).
    progress: called as ``progress(n, total, "case/key")`` before each figure is drawn.

  Returns:
    The HTML text.
  """
  counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(report.counts().items()))
  summary = f"{len(report.rows)} {report.unit}: {counts}" if counts else ""
  title = f"nnx-pool regression {report.command}" + (f": {counts}" if counts else "")
  parts = [
      "<!DOCTYPE html>",
      '<html lang="en"><head><meta charset="utf-8">',
      f"<title>{_e(title)}</title>",
      f"<style>{_STYLE}</style></head><body>",
      f"<h1>{_e(f'nnx-pool regression {report.command}')}</h1>",
      *_tests(report.pytest),
  ]
  if report.error:
    parts.append(f'<p class="ERROR">error: {_e(report.error)}</p>')
    return "\n".join([*parts, "</body></html>", ""])
  verdict = f"exit code {report.exit_code}" + (" (dry run)" if report.dry_run else "")
  line = [summary] if summary else []
  line += [verdict, f"baseline {report.baseline or '-'}"]
  parts.append(f"<p>{' &middot; '.join(_e(s) for s in line)}</p>")
  rows = page_order(report.rows)
  parts += _headers(report)
  first, rest = report.headline[:HEAD_LINES], report.headline[HEAD_LINES:]
  if first or report.cause:
    parts += ["<h2>What changed first</h2>"]
    parts += [f"<p><b>{_e(report.cause)}</b></p>"] if report.cause else []
    parts += ['<ul class="details">', *(f"<li>{_e(line)}</li>" for line in first),
              "</ul>"] if first else []
    parts += [f'<p class="muted">{len(rest)} more lines after the table.</p>'] if rest else []
  if report.attribution:
    said = report.attribution
    parts += ["<h2>The program or the compiler</h2>", f"<p>{_e(said['line'])}</p>"]
    parts += [f"<pre>{_e(chr(10).join(said['diff']))}</pre>"] if said.get("diff") else []
  parts += _table(rows, summary)
  if rest:  # a renamed model's schema list can be long: the table first
    parts += ["<h2>What changed (continued)</h2>", '<ul class="details">',
              *(f"<li>{_e(line)}</li>" for line in rest), "</ul>"]
  parts += _failures(rows, progress)
  parts += _stamps(report)
  timed = timing_lines(report.timings, every=True)  # the page holds it all, below the rest
  if timed:
    parts += ["<h2>Timing</h2>", '<p class="muted">baseline &rarr; now; reported, never failed</p>',
              f"<pre>{_e(chr(10).join(timed))}</pre>"]
  if report.notes:
    parts += ["<h2>Notes</h2>", "<ul>", *(f"<li>{_e(n)}</li>" for n in report.notes), "</ul>"]
  return "\n".join([*parts, "</body></html>", ""])


def page_order(rows: Sequence[Row]) -> list[Row]:
  """The rows as the page lists them: by status in :data:`ORDER` (an unknown status last),
  the batch's order within a status."""
  rank = {status: i for i, status in enumerate(ORDER)}
  return sorted(rows, key=lambda row: rank.get(row.status, len(ORDER)))


def closing_line(path: str | os.PathLike) -> str:
  """The line ``check --html`` and ``rehearse --html`` print once the page at ``path`` is
  written: it speaks of heatmaps only when the page holds some."""
  with open(path, encoding="utf-8") as page:
    figures = page.read().count("<figure>")
  if figures:
    return f"(the HTML report, with heatmaps of the failing arrays, is in {path})"
  return f"(the HTML report is in {path})"


def _e(text: Any) -> str:
  return html.escape(str(text), quote=True)


def _anchor(case: str) -> str:
  return "case-" + urllib.parse.quote(case, safe="")


# ------------------------------------------------------------------ sections


def _tests(result: Mapping[str, Any] | None) -> list[str]:
  """The user's tests' result, where ``rehearse --pytest`` ran them: the command, its exit
  status and what it means, the tests by outcome, the ids that failed or errored."""
  if not result:
    return []
  status = result.get("exit_status")
  counts = result.get("counts")
  found = (", ".join(f"{n} {what}" for what, n in sorted(counts.items())) if counts
           else "no counts (pytest stopped before the end)")
  verdict = f"{status} ({result.get('meaning', 'unknown')})"
  failed = result.get("failed") or []
  return ["<h2>Your tests</h2>",
          f"<p><code>{_e(result.get('command', 'pytest'))}</code> exited "
          f'<span class="{"PASS" if status == 0 else "FAIL"}">{_e(verdict)}</span>: '
          f"{_e(found)}</p>",
          *(['<ul class="details">', *(f"<li>{_e(name)}</li>" for name in failed), "</ul>"]
            if failed else [])]


def _sides(report: Report) -> tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]:
  """``((name, stamp) of the baseline, (name, stamp) of this run)``; A and B for ``diff``."""
  base, now = report.baseline_stamp or {}, report.stamp or {}
  return (("baseline", base), ("this run", now)) if report.command == "check" else (
      ("A", base), ("B", now))


def _headers(report: Report) -> list[str]:
  """The CLI's two stamp lines, and the environment changes."""
  (left, base), (right, now) = _sides(report)
  if not (base or now):
    return []
  lines = [f"{side + ':':<10}{stamp_header(stamp)}" for side, stamp in ((right, now), (left, base))]
  recorded = f" (baseline recorded {report.recorded})" if report.recorded else ""
  changes = [f"  {c}" for c in report.stamp_changes] or ["  (none)"]
  return [f"<pre>{_e(chr(10).join(lines))}</pre>",
          f"<p>environment changes{_e(recorded)}:</p>",
          f"<pre>{_e(chr(10).join(changes))}</pre>"]


def _stamps(report: Report) -> list[str]:
  """Both stamps side by side, changed values marked."""
  (left, base), (right, now) = _sides(report)
  if not (base or now):
    return []
  out = ["<h2>Environments</h2>",
         f'<table class="stamp"><tr><th></th><th>{_e(left)}</th><th>{_e(right)}</th></tr>',
         f'<tr><td>date</td><td class="v">{_e(base.get("date") or "unknown")}</td>'
         f'<td class="v">{_e(now.get("date") or "unknown")}</td></tr>']
  for label, before, after, changed in stamp_rows(base, now):
    cls = ' class="changed"' if changed else ""
    out.append(f'<tr{cls}><td>{_e(label)}</td><td class="v">{_e(before)}</td>'
               f'<td class="v">{_e(after)}</td></tr>')
  out.append("</table>")
  return out


def _table(rows: Sequence[Row], summary: str) -> list[str]:
  """The CLI's table and summary line, one line per case: failing names link to their section,
  statuses are coloured."""
  if not rows:
    return []
  last = len(COLUMNS) - 1

  def cell(r: int, column: int, text: str) -> str:
    row = rows[r - 1] if r else None
    if row is not None and column == 0 and row.status in FAILING:
      return f'<a href="#{_e(_anchor(row.case))}">{_e(text)}</a>'
    if row is not None and column == last:
      return f'<span class="{_e(text)}">{_e(text)}</span>'
    return _e(text)

  body = [*aligned(table(rows), cell), _e(summary)]
  return ["<h2>Cases</h2>", "<pre>" + "\n".join(body) + "</pre>"]


def _failures(rows: Sequence[Row], progress: Progress | None) -> list[str]:
  failing = [r for r in rows if r.status in FAILING]
  if not failing:
    return []
  # MAX_FIGURES in all: each failing case's first array, the worst cases first, then the
  # cases' other arrays in page order.
  worst = sorted((r for r in failing if r.failed), key=lambda r: (excess(r), r.max_abs or 0.0),
                 reverse=True)
  firsts = [(r.case, min(r.failed)) for r in worst]
  others = [(r.case, key) for r in failing for key in sorted(r.failed)[1:]]
  drawn = set((firsts + others)[:MAX_FIGURES])
  total = len(firsts) + len(others)
  out = ["<h2>Failures</h2>"]
  if total > len(drawn):
    every = (", at least one of every failing case" if len(firsts) <= MAX_FIGURES else
             f" (at most {MAX_FIGURES}): one of each of the failing cases whose worst element "
             "is furthest off")
    out.append(f'<p class="muted">{total} arrays failed; {len(drawn)} are drawn{every}. Run '
               "<code>check -k PATTERN --html OUT</code> to draw the others.</p>")
  done = 0
  for row in failing:
    tolerance = f' <span class="muted">{_e(row.tolerance)}</span>' if row.tolerance else ""
    out.append(f'<section id="{_e(_anchor(row.case))}"><h3>{_e(row.case)} '
               f'<span class="{_e(row.status)}">{_e(row.status)}</span>{tolerance}</h3>')
    if row.details:
      out += ['<ul class="details">', *(f"<li>{_e(d)}</li>" for d in row.details), "</ul>"]
    for key in sorted(row.failed):
      if (row.case, key) not in drawn:
        continue
      done += 1
      if progress is not None:
        progress(done, len(drawn), f"{row.case}/{key}")
      png, alt, caption = _figure(key, row.failed[key])
      out.append(f'<figure><img alt="{_e(alt)}" src="data:image/png;base64,{png}">'
                 f"<figcaption>{caption}</figcaption></figure>")
    out.append("</section>")
  return out


# ------------------------------------------------------------------- slices


def _shown_axes(ndim: int, spatial: tuple[int, ...]) -> tuple[int | None, int | None]:
  """The axes drawn as rows and as columns (None: a single row or column)."""
  if len(spatial) == 1:
    return None, spatial[0]
  if len(spatial) >= 2:
    return spatial[-2], spatial[-1]
  if ndim <= 1:
    return None, (0 if ndim == 1 else None)
  return ndim - 2, ndim - 1


def _axis_names(ndim: int, spatial: tuple[int, ...]) -> dict[int, str]:
  if not spatial:
    return {}
  names = {ndim - 1: "channel"}
  if spatial[0] == 1:
    names[0] = "sample"
  if len(spatial) == 3:
    names[spatial[0]] = "depth"
  return names


def worst_slice(
    key: str, shape: tuple[int, ...], spatial: tuple[int, ...], worst: tuple[int, ...]
) -> tuple[tuple[Any, ...], str]:
  """The index of the 2-D slice through element ``worst``, and its description.

  Args:
    key: the array's key, for the description (``output``).
    shape: the array's shape.
    spatial: its spatial axes (:class:`~nnx_pool.regression.report.FailedArray`).
    worst: the element the slice goes through.

  Returns:
    ``(index, text)``, e.g. ``((0, slice(None), slice(None), 1),
    "output[0, :, :, 1] (sample 0, channel 1)")``.
  """
  rows, cols = _shown_axes(len(shape), spatial)
  names = _axis_names(len(shape), spatial)
  index = tuple(slice(None) if axis in (rows, cols) else worst[axis] for axis in range(len(shape)))
  shown = ", ".join(":" if isinstance(i, slice) else str(i) for i in index)
  fixed = ", ".join(f"{names[axis]} {i}" if axis in names else f"axis {axis} index {i}"
                    for axis, i in enumerate(index) if not isinstance(i, slice))
  text = f"{key}[{shown}]" if shape else key
  return index, text + (f" ({fixed})" if fixed else "")


def _as_2d(values: np.ndarray, shape: tuple[int, ...], spatial: tuple[int, ...]) -> np.ndarray:
  rows, _ = _shown_axes(len(shape), spatial)
  return values.reshape(1, -1) if rows is None else values


# ------------------------------------------------------------------ figures


def _figure(key: str, failed: FailedArray) -> tuple[str, str, str]:
  """One failing array drawn: ``(base64 PNG, alt text, caption HTML)``."""
  from matplotlib import colormaps
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.colors import ListedColormap, Normalize
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator

  base, new, tol = failed.baseline, failed.new, failed.tolerance
  shape, spatial = tuple(base.shape), failed.spatial
  bad = failing_elements(new, base, tol)
  b, n = base.astype(np.float64), new.astype(np.float64)
  with np.errstate(all="ignore"):
    both = np.isfinite(b) & np.isfinite(n)
    diff = np.where(both, np.abs(n - b), np.where((b == n) | (np.isnan(b) & np.isnan(n)), 0.0,
                                                  np.nan))
  score = np.where(bad, np.where(np.isnan(diff), np.inf, diff), -1.0)
  worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(score)), shape)) if shape else ()
  index, where = worst_slice(key, shape, spatial, worst)
  b2, n2, d2, bad2 = (_as_2d(a[index], shape, spatial) for a in (b, n, diff, bad))
  integer = not is_float(base.dtype)

  rows, cols = b2.shape
  panel_h = min(max(2.9 * rows / cols, 0.45), 3.1, 0.75 * rows)  # cells at most 0.75 in
  fig = Figure(figsize=(10, panel_h + 1.0), dpi=_DPI, layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(1, 3)
  finite = np.concatenate([b2[np.isfinite(b2)], n2[np.isfinite(n2)]])
  lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
  if lo == hi:
    lo, hi = lo - 0.5, hi + 0.5
  values = colormaps["viridis"].with_extremes(bad=_BAD)
  norm = Normalize(lo, hi)
  for ax, data, label in ((axes[0], b2, "baseline"), (axes[1], n2, "new (this run)")):
    image = ax.imshow(np.ma.masked_invalid(data), cmap=values, norm=norm, interpolation="nearest")
    ax.set_title(label, fontsize=11)
    _label_cells(ax, data, integer, lambda v: values(norm(v)))
  fig.colorbar(image, ax=axes[:2], shrink=0.9, pad=0.02)
  differs = int(bad2.sum())
  if integer:
    axes[2].imshow(bad2.astype(float), cmap=ListedColormap(["#f2f2f2", "#d62728"]),
                   norm=Normalize(0, 1), interpolation="nearest")
    axes[2].set_title(f"cells that differ ({differs} of {bad2.size} here)", fontsize=11)
    if rows <= _ANNOTATE and cols <= _ANNOTATE:
      for r, c in zip(*np.nonzero(bad2), strict=True):
        axes[2].text(c, r, f"{b2[r, c]:.0f}\u2192{n2[r, c]:.0f}", ha="center", va="center",
                     fontsize=8, color="white")
  else:
    top = float(np.nanmax(d2)) if np.isfinite(d2).any() else 0.0
    reds = colormaps["Reds"].with_extremes(bad=_BAD)
    image = axes[2].imshow(np.ma.masked_invalid(d2), cmap=reds, norm=Normalize(0, top or 1.0),
                           interpolation="nearest")
    axes[2].set_title("|new \u2212 baseline|", fontsize=11)
    fig.colorbar(image, ax=axes[2], shrink=0.9, pad=0.02)
    _outline(axes[2], bad2)
  for ax in axes:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.tick_params(labelsize=8)
    if rows == 1:
      ax.set_yticks([])
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", metadata={"Software": None})
  png = base64.b64encode(buffer.getvalue()).decode("ascii")

  count = int(bad.sum())
  copy = f", copy {failed.copy[0]} of {failed.copy[1]} of the sharded run" if failed.copy else ""
  alt = f"{key}: baseline, new and difference of {where}"
  whole = all(isinstance(i, slice) for i in index)
  shown = "the whole array" if whole else (
      f"the slice through the worst failing element {_e(worst)}")
  caption = [f"<b>{_e(key)}</b>: {count} of {bad.size} elements fail{_e(copy)}. "
             f"Shown: <code>{_e(where)}</code>, {shown}."]
  if not (np.isfinite(b2).all() and np.isfinite(n2).all()):
    caption.append("Grey cells are NaN or \u00b1inf.")
  caption.append(_tolerance_text(tol, b2, integer))
  if tol.reason:
    caption.append(f"Why this tolerance: {_e(tol.reason)}.")
  return png, alt, " ".join(caption)


def _label_cells(ax: Any, data: np.ndarray, integer: bool, colour: Callable[[float], Any]) -> None:
  """Writes NaN/inf cells' values, and every value of a small integer slice.

  ``colour(value)`` is the cell's RGBA; the text is white on dark cells, black on light ones.
  """
  rows, cols = data.shape
  every = integer and rows <= _ANNOTATE and cols <= _ANNOTATE
  for r, c in np.argwhere(np.ones_like(data, bool) if every else ~np.isfinite(data)):
    value = data[r, c]
    if not np.isfinite(value):
      text, ink = ("nan" if np.isnan(value) else ("inf" if value > 0 else "-inf")), "black"
    else:
      red, green, blue, _ = colour(value)  # pyright: ignore[reportArgumentType]  # a scalar
      text = f"{value:.0f}"
      ink = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"
    ax.text(c, r, text, ha="center", va="center", fontsize=8, color=ink)


def _outline(ax: Any, bad: np.ndarray) -> None:
  """Draws the border of the failing cells: every cell edge between a failing and a passing
  cell (or the map's edge), so a block of failing cells gets one outline at any map size."""
  from matplotlib.collections import LineCollection

  padded = np.pad(bad, 1)
  vertical = padded[1:-1, 1:] != padded[1:-1, :-1]  # (rows, cols + 1): the edge left of (r, c)
  horizontal = padded[1:, 1:-1] != padded[:-1, 1:-1]  # (rows + 1, cols): the edge above (r, c)
  edges = [((c - 0.5, r - 0.5), (c - 0.5, r + 0.5)) for r, c in np.argwhere(vertical)]
  edges += [((c - 0.5, r - 0.5), (c + 0.5, r - 0.5)) for r, c in np.argwhere(horizontal)]
  if edges:
    # Not clipped: a failing cell on the map's edge keeps the half of its border outside.
    ax.add_collection(LineCollection(edges, colors=_OUTLINE, linewidths=2.2, clip_on=False))


def _tolerance_text(tol: Any, baseline: np.ndarray, integer: bool) -> str:
  if integer:
    return ("Integer results (indices) are compared exactly; the right panel marks the cells "
            "that differ, with <i>baseline&rarr;new</i> written in them.")
  if tol.rule == "sum":
    return ("Tolerance: <code>sum exact</code>, totals per sample and channel must be equal; "
            "outlined in blue: the cells whose total differs.")
  if tol.rule == "exact":
    return "Tolerance: <code>exact</code>; outlined in blue: the cells that differ."
  scale = np.abs(baseline[np.isfinite(baseline)])
  limit = ""
  if scale.size:
    lo, hi = tol.atol + tol.rtol * float(scale.min()), tol.atol + tol.rtol * float(scale.max())
    limit = f" (in this slice the limit runs from {lo:.3g} to {hi:.3g})"
  return (f"Tolerance: <code>rtol={tol.rtol:g} atol={tol.atol:g}</code>; outlined in blue: "
          f"the cells where |new &minus; baseline| &gt; atol + rtol&middot;|baseline|{limit}.")
