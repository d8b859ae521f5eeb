"""Reports: what every command found, as the table it prints, as JSON, and as an HTML page.

* :mod:`.data`: the report (rows, timings, both stamps, the headline) and its JSON;
* :mod:`.text`: the table every command prints, and its timing lines;
* :mod:`.html`: ``--html OUT``, one self-contained page with heatmaps of what failed
  (matplotlib, imported only when a page is drawn).
"""

from .data import FAILING, NOISE, FailedArray, Report, Row, Timing, recorded_label, write_json
from .text import COLUMNS, aligned, excess, render, shown_rows, table, timing_lines

__all__ = ["COLUMNS", "FAILING", "NOISE", "FailedArray", "Report", "Row", "Timing", "aligned",
           "excess", "recorded_label", "render", "shown_rows", "table", "timing_lines",
           "write_json"]
