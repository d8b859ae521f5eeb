"""Draws the guides' figures as hand-written SVG, from numbers the library computes.

Usage::

    python guides/make_figures.py          # (re)write guides/figures/*.svg
    python guides/make_figures.py --check  # exit 1 if a committed figure is stale

Every number drawn (pooled values, indices, gradients, sums, divisors, bins) comes
from calling nnx-pool on the guide's input; only the layout is written here. The
output is deterministic: integer or fixed-precision coordinates, no timestamps, no
plotting library, so the same library gives the same bytes and
``tests/test_guides.py`` can compare the committed files with a fresh rendering.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

import jax
import jax.numpy as jnp
import numpy as np

FIGURES_DIR = Path(__file__).resolve().parent / "figures"

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
INK = "#222222"
MUTED = "#666666"
GRID = "#9a9a9a"
PAD_FILL = "#eeeeee"
# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
WINDOW_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7")
ACCENT = "#0072B2"
WARN = "#D55E00"


# ----------------------------------------------------------------------------
# SVG primitives. Coordinates are formatted with at most one decimal.
# ----------------------------------------------------------------------------


def _c(value: float) -> str:
  """A coordinate: one decimal at most, no trailing zeros, no negative zero."""
  text = f"{float(value):.1f}"
  if text.endswith(".0"):
    text = text[:-2]
  return "0" if text == "-0" else text


def num(value) -> str:
  """A data value for display: shortest exact form, with a typographic minus."""
  value = float(value)
  if np.isnan(value):
    return "NaN"
  text = f"{value:.6g}"
  return text.replace("-", "\u2212")


class Svg:
  """An SVG document built from element strings, in drawing order."""

  def __init__(self, width: int, height: int, title: str, desc: str):
    self.width, self.height = width, height
    self.title, self.desc = title, desc
    self.defs: list[str] = []
    self.body: list[str] = []

  def add(self, element: str) -> None:
    self.body.append(element)

  def rect(self, x, y, w, h, *, fill="none", stroke="none", width=1.0, opacity=None,
           rx=0, dash=None, stroke_opacity=None) -> None:
    attrs = [f'x="{_c(x)}" y="{_c(y)}" width="{_c(w)}" height="{_c(h)}"']
    if rx:
      attrs.append(f'rx="{_c(rx)}"')
    attrs.append(f'fill="{fill}"')
    if opacity is not None:
      attrs.append(f'fill-opacity="{opacity}"')
    if stroke != "none":
      attrs.append(f'stroke="{stroke}" stroke-width="{_c(width)}"')
    if stroke_opacity is not None:
      attrs.append(f'stroke-opacity="{stroke_opacity}"')
    if dash:
      attrs.append(f'stroke-dasharray="{dash}"')
    self.add(f"<rect {' '.join(attrs)}/>")

  def text(self, x, y, content: str, *, size=14, anchor="middle", weight="normal",
           fill=INK, italic=False) -> None:
    style = ' font-style="italic"' if italic else ""
    bold = f' font-weight="{weight}"' if weight != "normal" else ""
    self.add(
        f'<text x="{_c(x)}" y="{_c(y)}" font-size="{size}" text-anchor="{anchor}"'
        f' fill="{fill}"{bold}{style}>{escape(content)}</text>'
    )

  def line(self, x1, y1, x2, y2, *, stroke=MUTED, width=1.5, arrow=False, dash=None) -> None:
    extra = ' marker-end="url(#arrow)"' if arrow else ""
    if dash:
      extra += f' stroke-dasharray="{dash}"'
    self.add(
        f'<line x1="{_c(x1)}" y1="{_c(y1)}" x2="{_c(x2)}" y2="{_c(y2)}" stroke="{stroke}"'
        f' stroke-width="{_c(width)}"{extra}/>'
    )

  def render(self) -> str:
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}"'
        f' viewBox="0 0 {self.width} {self.height}" font-family="{FONT}">',
        f"<title>{escape(self.title)}</title>",
        f"<desc>{escape(self.desc)}</desc>",
        "<defs>",
        '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7"'
        ' markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"'
        f' fill="{MUTED}"/></marker>',
        '<pattern id="hatch" width="8" height="8" patternUnits="userSpaceOnUse"'
        ' patternTransform="rotate(45)"><rect width="8" height="8" fill="#f2f2f2"/>'
        '<line x1="0" y1="0" x2="0" y2="8" stroke="#c8c8c8" stroke-width="3"/></pattern>',
        *self.defs,
        "</defs>",
        f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>',
    ]
    return "\n".join([*head, *self.body, "</svg>"]) + "\n"


def _caption(svg: Svg, y: float, lines: Iterable[str], *, x: float = 24) -> None:
  for i, line in enumerate(lines):
    svg.text(x, y + 18 * i, line, size=13, anchor="start", fill=MUTED)


def _cell_fills(svg: Svg, x0, y0, shape: tuple[int, int], cell: float, fills=None) -> None:
  """The cells of a grid; ``fills[r][c]`` lists colours (several: vertical slices)."""
  rows, cols = shape
  for r in range(rows):
    for c in range(cols):
      x, y = x0 + c * cell, y0 + r * cell
      colours = fills[r][c] if fills is not None else []
      if colours:
        slice_w = cell / len(colours)
        for k, colour in enumerate(colours):
          svg.rect(x + k * slice_w, y, slice_w, cell, fill=colour, opacity=0.45)
      svg.rect(x, y, cell, cell, stroke=GRID, width=1)


def _cell_text(svg: Svg, x0, y0, values: np.ndarray, cell: float, *, size=18,
               weight="normal", index_labels=False, text_fill=None) -> None:
  """The values of a grid (drawn after any outlines, so strokes never hide them)."""
  rows, cols = values.shape
  for r in range(rows):
    for c in range(cols):
      x, y = x0 + c * cell, y0 + r * cell
      colour = INK if text_fill is None else text_fill[r][c]
      svg.text(x + cell / 2, y + cell / 2 + size * 0.35, num(values[r, c]), size=size,
               weight=weight, fill=colour)
      if index_labels:
        svg.text(x + cell - 7, y + cell - 7, str(r * cols + c), size=10, anchor="end",
                 fill=MUTED)


def _cells(svg: Svg, x0, y0, values: np.ndarray, cell: float, *, fills=None, **text) -> None:
  """A grid of square cells holding ``values``."""
  _cell_fills(svg, x0, y0, values.shape, cell, fills)
  _cell_text(svg, x0, y0, values, cell, **text)


def _window_outline(svg: Svg, x0, y0, cell, r0, c0, h, w, colour, inset) -> None:
  svg.rect(x0 + c0 * cell + inset, y0 + r0 * cell + inset, w * cell - 2 * inset,
           h * cell - 2 * inset, stroke=colour, width=3.5, rx=3, stroke_opacity=0.9)


# ----------------------------------------------------------------------------
# Guide 1: average pooling.
# ----------------------------------------------------------------------------


def figure_average_pooling() -> str:
  from nnx_pool import AvgPool

  x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
  y = np.asarray(AvgPool((2, 2))(x))[0, ..., 0]
  grid = x[0, ..., 0]

  svg = Svg(660, 400, "AvgPool((2, 2)) on arange(16)",
            "A 4 by 4 input with four 2 by 2 windows, each averaged to one output cell.")
  svg.text(24, 32, "AvgPool((2, 2)) on x = arange(16).reshape(1, 4, 4, 1)", size=17,
           anchor="start", weight="bold")
  cell, x0, y0 = 60, 24, 84
  fills = [[[WINDOW_COLOURS[(r // 2) * 2 + c // 2]] for c in range(4)] for r in range(4)]
  svg.text(x0, y0 - 12, "input x[0, :, :, 0]  (H = W = 4)", size=13, anchor="start",
           fill=MUTED)
  _cell_fills(svg, x0, y0, grid.shape, cell, fills)
  for k in range(4):
    _window_outline(svg, x0, y0, cell, 2 * (k // 2), 2 * (k % 2), 2, 2, WINDOW_COLOURS[k], 3)
  _cell_text(svg, x0, y0, grid, cell)

  ox, oy, ocell = 400, 84, 120
  svg.line(x0 + 4 * cell + 18, y0 + 2 * cell, ox - 18, y0 + 2 * cell, arrow=True, width=2)
  svg.text((x0 + 4 * cell + ox) / 2, y0 + 2 * cell - 12, "mean of each", size=13,
           fill=MUTED)
  svg.text((x0 + 4 * cell + ox) / 2, y0 + 2 * cell + 22, "2×2 window", size=13, fill=MUTED)
  svg.text(ox, y0 - 12, "output y[0, :, :, 0]  (2×2)", size=13, anchor="start", fill=MUTED)
  for r in range(2):
    for c in range(2):
      k = r * 2 + c
      cx, cy = ox + c * ocell, oy + r * ocell
      svg.rect(cx, cy, ocell, ocell, fill=WINDOW_COLOURS[k], opacity=0.45)
      svg.rect(cx, cy, ocell, ocell, stroke=GRID)
      svg.text(cx + ocell / 2, cy + ocell / 2 + 4, num(y[r, c]), size=24, weight="bold")
      window = grid[2 * r:2 * r + 2, 2 * c:2 * c + 2].ravel()
      svg.text(cx + ocell / 2, cy + ocell / 2 + 24,
               "(" + "+".join(num(v) for v in window) + ")/4", size=12, fill=INK)
  _caption(svg, 350, [
      "Each colour is one window (stride = window = 2, VALID): the output cell of the same colour",
      "is the mean of the four input cells inside it. Values computed by nnx_pool.AvgPool.",
  ])
  return svg.render()


# ----------------------------------------------------------------------------
# Guide 2: SAME padding and count_include_pad.
# ----------------------------------------------------------------------------


def figure_same_padding() -> str:
  from nnx_pool import AvgPool, output_shape
  from nnx_pool._geometry import Window

  x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32).reshape(1, 2, 2, 1)
  kwargs = dict(strides=1, padding="SAME")
  include = np.asarray(AvgPool((2, 2), **kwargs)(x))[0, ..., 0]
  exclude = np.asarray(AvgPool((2, 2), count_include_pad=False, **kwargs)(x))[0, ..., 0]
  sums = np.asarray(AvgPool((2, 2), divisor_override=1, **kwargs)(x))[0, ..., 0]
  # Real cells per window: the sum over an input of ones, padding being zeros.
  real = np.asarray(AvgPool((2, 2), divisor_override=1, **kwargs)(np.ones_like(x)))[0, ..., 0]
  # The pads SAME places, from the one geometry the modules use.
  (lo, hi), _ = Window.create(2, 1, "SAME").resolve((2, 2)).pads
  size = 2 + lo + hi
  if output_shape(x.shape, 2, 1, "SAME") != x.shape or size != (2 - 1) * 1 + 2:
    raise RuntimeError("SAME with stride 1 must keep the 2x2 shape, windows spanning the pad")
  padded = np.zeros((size, size), dtype=np.float32)
  padded[lo:lo + 2, lo:lo + 2] = x[0, ..., 0]
  is_pad = np.ones((size, size), dtype=bool)
  is_pad[lo:lo + 2, lo:lo + 2] = False

  svg = Svg(760, 580, "SAME padding: count_include_pad True versus False",
            "Four windows over a 2 by 2 input padded on the high side, with both divisors.")
  svg.text(24, 32, 'AvgPool((2, 2), strides=1, padding="SAME") on [[1, 2], [3, 4]]', size=17,
           anchor="start", weight="bold")
  svg.text(24, 54, f"SAME pads (low, high) = ({lo}, {hi}) per dim: the extra cell goes on the "
           "bottom and the right.", size=13, anchor="start", fill=MUTED)
  cell, top, left, gap = 46, 100, 24, 50
  for k in range(4):
    r, c = divmod(k, 2)
    px = left + k * (size * cell + gap)
    svg.text(px + size * cell / 2, top - 12, f"output [{r}, {c}]", size=14, weight="bold")
    for i in range(size):
      for j in range(size):
        cx, cy = px + j * cell, top + i * cell
        in_window = r <= i < r + 2 and c <= j < c + 2
        if is_pad[i, j]:
          svg.rect(cx, cy, cell, cell, fill="url(#hatch)")
        elif in_window:
          svg.rect(cx, cy, cell, cell, fill=WINDOW_COLOURS[k], opacity=0.45)
        svg.rect(cx, cy, cell, cell, stroke=GRID)
        label = "pad" if is_pad[i, j] else num(padded[i, j])
        svg.text(cx + cell / 2, cy + cell / 2 + 6, label, size=12 if is_pad[i, j] else 17,
                 fill=MUTED if is_pad[i, j] else INK, italic=bool(is_pad[i, j]))
    _window_outline(svg, px, top, cell, r, c, 2, 2, WINDOW_COLOURS[k], 2)
    ty = top + size * cell + 24
    svg.text(px, ty, f"sum = {num(sums[r, c])}", size=14, anchor="start")
    svg.text(px, ty + 22, f"True:  ÷ 4 = {num(include[r, c])}", size=14, anchor="start",
             fill=ACCENT)
    svg.text(px, ty + 44, f"False: ÷ {num(real[r, c])} = {num(exclude[r, c])}", size=14,
             anchor="start", fill=WARN)

  gy, gcell = 360, 56
  for title, values, colour, gx in (
      ("count_include_pad=True (default, Flax)", include, ACCENT, 90),
      ("count_include_pad=False (Keras, TF)", exclude, WARN, 420),
  ):
    svg.text(gx, gy - 12, title, size=14, anchor="start", fill=colour, weight="bold")
    fills = [[[WINDOW_COLOURS[r * 2 + c]] for c in range(2)] for r in range(2)]
    _cells(svg, gx + 40, gy, values, gcell, fills=fills, size=18, weight="bold")
  svg.rect(24, 496, 20, 20, fill="url(#hatch)", stroke=GRID)
  svg.text(52, 511, "SAME padding (zeros)", size=13, anchor="start", fill=MUTED)
  _caption(svg, 540, [
      "True divides every window by its 4 cells; False divides by the real cells only.",
      "Values computed by nnx_pool.AvgPool (sums with divisor_override=1).",
  ])
  return svg.render()


# ----------------------------------------------------------------------------
# Guide 3: max pooling, indices and the gradient.
# ----------------------------------------------------------------------------

SEED_GRID = np.array(
    [[1, 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]], dtype=np.float32
)


def _max_row(svg: Svg, y0: float, window: int, stride: int, label: str) -> None:
  from nnx_pool import MaxPool

  x = SEED_GRID.reshape(1, 4, 4, 1)
  weights = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32).reshape(1, 2, 2, 1)
  pool = MaxPool((window, window), strides=stride, return_indices=True)
  values, indices = (np.asarray(a)[0, ..., 0] for a in pool(x))
  grad = np.asarray(jax.grad(
      lambda g: jnp.sum(MaxPool((window, window), strides=stride)(g) * weights))(x))[0, ..., 0]
  out = values.shape[0]
  assert out == 2, "the layout below draws a 2x2 output"

  winners: list[list[list[str]]] = [[[] for _ in range(4)] for _ in range(4)]
  for k in range(4):
    r, c = divmod(int(indices[k // 2, k % 2]), 4)
    winners[r][c].append(WINDOW_COLOURS[k])

  cell, x0 = 52, 24
  svg.text(x0, y0 - 34, label, size=15, anchor="start", weight="bold")
  svg.text(x0, y0 - 12, "input; small numbers: flat index h·W + w", size=12, anchor="start",
           fill=MUTED)
  _cell_fills(svg, x0, y0, SEED_GRID.shape, cell, winners)
  insets = (3, 6, 9, 12) if stride < window else (3, 3, 3, 3)
  for k in range(4):
    r, c = divmod(k, 2)
    _window_outline(svg, x0, y0, cell, r * stride, c * stride, window, window,
                    WINDOW_COLOURS[k], insets[k])
  _cell_text(svg, x0, y0, SEED_GRID, cell, size=17, index_labels=True)

  px, pcell = 330, 74
  svg.line(x0 + 4 * cell + 12, y0 + 2 * cell, px - 12, y0 + 2 * cell, arrow=True, width=2)
  svg.text(px, y0 - 12, "values, indices", size=12, anchor="start", fill=MUTED)
  for r in range(2):
    for c in range(2):
      k = r * 2 + c
      cx, cy = px + c * pcell, y0 + 30 + r * pcell
      svg.rect(cx, cy, pcell, pcell, fill=WINDOW_COLOURS[k], opacity=0.45)
      svg.rect(cx, cy, pcell, pcell, stroke=GRID)
      svg.text(cx + pcell / 2, cy + pcell / 2 + 2, num(values[r, c]), size=20, weight="bold")
      svg.text(cx + pcell / 2, cy + pcell / 2 + 22, f"index {int(indices[r, c])}", size=11)

  gx = 560
  svg.line(px + 2 * pcell + 12, y0 + 2 * cell, gx - 12, y0 + 2 * cell, arrow=True, width=2)
  svg.text(gx, y0 - 12, "∂/∂x of Σ w·y, w = [[1, 2], [3, 4]]", size=12, anchor="start",
           fill=MUTED)
  text_fill = [[INK if grad[r, c] else "#b5b5b5" for c in range(4)] for r in range(4)]
  _cells(svg, gx, y0, grad, cell, fills=winners, size=17, weight="bold", text_fill=text_fill)


def figure_max_pooling() -> str:
  svg = Svg(800, 700, "MaxPool: argmax cells and where the gradient lands",
            "Two rows: 2 by 2 windows at stride 2, then overlapping 3 by 3 windows at stride 1.")
  svg.text(24, 32, "MaxPool on the 4×4 grid: the winners, their indices, and the gradient",
           size=17, anchor="start", weight="bold")
  _max_row(svg, 110, 2, 2, "MaxPool((2, 2)): stride 2, windows do not overlap")
  _max_row(svg, 400, 3, 1, "MaxPool((3, 3), strides=1): windows overlap, a cell can win twice")
  _caption(svg, 650, [
      "Filled cells won their window (colour = window; split fill = won two windows). The gradient",
      "of each output lands on its winner only, and adds up where one cell wins twice (1+2, 3+4).",
  ])
  return svg.render()


# ----------------------------------------------------------------------------
# Guide 4: global pooling and a squeeze-excitation gate.
# ----------------------------------------------------------------------------

SE_STATE = {  # guides/04: torchvision SqueezeExcitation(4, 2) layout, as NumPy arrays
    "fc1.weight": np.array([[1, 0, -1, 0], [0, 0, 0, 1]], dtype=np.float32).reshape(2, 4, 1, 1),
    "fc1.bias": np.array([0, -1], dtype=np.float32),
    "fc2.weight": np.array([[5, 0], [0, 1], [0, -1], [0, 2]], dtype=np.float32).reshape(4, 2, 1, 1),
    "fc2.bias": np.zeros(4, dtype=np.float32),
}


def striped_map() -> np.ndarray:
  """guides/04's (1, 12, 20, 4) input: channel c is c plus stripes of mean zero."""
  h, w = np.meshgrid(np.arange(12), np.arange(20), indexing="ij")
  stripes = (h + 2 * w) % 5 - 2
  return np.stack([c + stripes for c in range(4)], axis=-1).astype(np.float32)[None]


def _mix(colour: str, t: float) -> str:
  """``colour`` blended with white: t=0 white, t=1 the colour (hex, rounded)."""
  t = min(max(float(t), 0.0), 1.0)
  rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
  return "#" + "".join(f"{round(255 + (v - 255) * t):02x}" for v in rgb)


def _heatmap(svg: Svg, x0, y0, plane: np.ndarray, cell: float, vmax: float) -> None:
  """A diverging heat map: orange above zero, blue below, white at zero."""
  rows, cols = plane.shape
  for r in range(rows):
    for c in range(cols):
      v = float(plane[r, c])
      colour = _mix(WINDOW_COLOURS[0] if v >= 0 else ACCENT, abs(v) / vmax)
      svg.add(f'<rect x="{_c(x0 + c * cell)}" y="{_c(y0 + r * cell)}" width="{_c(cell)}"'
              f' height="{_c(cell)}" fill="{colour}"/>')
  svg.rect(x0, y0, cols * cell, rows * cell, stroke=GRID)


def figure_global_pooling_and_se() -> str:
  from nnx_pool import GlobalAvgPool, SqueezeExcitation

  x = striped_map()
  pooled = np.asarray(GlobalAvgPool()(x))[0]
  se = SqueezeExcitation.from_torch(SE_STATE)
  y = np.asarray(se(x))[0]
  scale = np.asarray(se.gate(se.fc2(se.activation(se.fc1(GlobalAvgPool()(x))))))[0]
  vmax = float(np.abs(x).max())

  svg = Svg(900, 610, "Global average pooling and a squeeze-excitation gate",
            "Four 12 by 20 channels, their means, the gate scale, and the scaled channels.")
  svg.text(24, 32, "SqueezeExcitation.from_torch(state_dict) on a (1, 12, 20, 4) map", size=17,
           anchor="start", weight="bold")
  cell, top, pitch = 6, 92, 98
  in_x, out_x = 24, 716
  pool_x, scale_x, box = 300, 500, 64
  svg.text(in_x, top - 22, "input x, channel c", size=13, anchor="start", fill=MUTED)
  svg.text(pool_x - 8, top - 22, "GlobalAvgPool", size=13, anchor="start", fill=MUTED)
  svg.text(scale_x - 30, top - 22, "fc1, ReLU, fc2, sigmoid", size=13, anchor="start",
           fill=MUTED)
  svg.text(out_x, top - 22, "output x · scale[c]", size=13, anchor="start", fill=MUTED)
  for c in range(4):
    y0 = top + c * pitch
    svg.text(in_x, y0 - 5, f"c = {c}", size=12, anchor="start", fill=INK)
    _heatmap(svg, in_x, y0, x[0, ..., c], cell, vmax)
    mid = y0 + 6 * cell
    svg.line(in_x + 20 * cell + 10, mid, pool_x - 10, mid, arrow=True)
    svg.rect(pool_x, mid - box / 2, box, box, fill=_mix(WINDOW_COLOURS[0], pooled[c] / vmax),
             stroke=GRID)
    svg.text(pool_x + box / 2, mid + 7, num(pooled[c]), size=20, weight="bold")
    svg.line(pool_x + box + 10, mid, scale_x - 10, mid, arrow=True)
    svg.rect(scale_x, mid - box / 2, box + 16, box, fill=ACCENT, opacity=float(
        f"{0.15 + 0.6 * scale[c]:.3f}"), stroke=GRID)
    svg.text(scale_x + (box + 16) / 2, mid + 7, f"{float(scale[c]):.3f}", size=18,
             weight="bold")
    svg.line(scale_x + box + 26, mid, out_x - 10, mid, arrow=True)
    _heatmap(svg, out_x, y0, y[..., c], cell, vmax)
  legend_y = top + 4 * pitch + 6
  for k, v in enumerate((-vmax, 0.0, vmax)):
    lx = 24 + k * 120
    colour = _mix(WINDOW_COLOURS[0] if v >= 0 else ACCENT, abs(v) / vmax)
    svg.rect(lx, legend_y, 18, 18, fill=colour, stroke=GRID)
    svg.text(lx + 26, legend_y + 14, num(v), size=13, anchor="start", fill=MUTED)
  svg.text(400, legend_y + 14, "one colour scale for input and output maps", size=13,
           anchor="start", fill=MUTED)
  _caption(svg, legend_y + 48, [
      "Each channel is c plus stripes of mean zero, so GlobalAvgPool gives exactly 0, 1, 2, 3.",
      "The gate maps them to sigmoid([0, 2, -2, 4]) and multiplies each channel by its scale;",
      "channel 2 fades to 0.119 of itself. Weights from a NumPy state dict; values from nnx_pool.",
  ])
  return svg.render()


# ----------------------------------------------------------------------------
# Guide 5: adaptive bins.
# ----------------------------------------------------------------------------


def equinox_bins(length: int, out: int) -> list[tuple[int, int]]:
  """Equinox's adaptive split (read from its source): the first ``length % out`` bins
  get one extra cell, and the bins do not overlap."""
  small, extra = divmod(length, out)
  sizes = [small + 1] * extra + [small] * (out - extra)
  starts = np.cumsum([0] + sizes[:-1])
  return [(int(s), int(s + n)) for s, n in zip(starts, sizes, strict=True)]


def figure_adaptive_pooling() -> str:
  from nnx_pool import AdaptiveAvgPool

  length, out = 14, 4
  values = np.arange(length, dtype=np.float32)
  pool = AdaptiveAvgPool((out,))
  means = np.asarray(pool(values.reshape(1, length, 1)))[0, :, 0]
  # Which bins hold each cell, asked of the library: pool a one-hot input per cell.
  onehots = np.eye(length, dtype=np.float32)[:, :, None]  # (L as batch, L, 1)
  member = np.asarray(pool(onehots))[:, :, 0] > 0  # member[cell, bin]
  bins = []
  for j in range(out):
    cells = np.flatnonzero(member[:, j])
    bins.append((int(cells[0]), int(cells[-1]) + 1))
  shared = [i for i in range(length) if member[i].sum() > 1]
  eqx = equinox_bins(length, out)
  eqx_means = [float(values[a:b].mean()) for a, b in eqx]

  cell, x0 = 48, 40
  svg = Svg(760, 560, "Adaptive average pooling: PyTorch bins versus Equinox bins",
            "Fourteen cells pooled to four outputs by two different binning rules.")
  svg.text(24, 32, "AdaptiveAvgPool((4,)) on arange(14): where the four bins fall", size=17,
           anchor="start", weight="bold")

  def cell_row(y0: float, shade: bool) -> None:
    for i in range(length):
      if shade and i in shared:
        svg.rect(x0 + i * cell, y0, cell, cell, fill=WARN, opacity=0.18)
      svg.rect(x0 + i * cell, y0, cell, cell, stroke=GRID)
      svg.text(x0 + i * cell + cell / 2, y0 + cell / 2 + 6, num(values[i]), size=16)

  def bar(j: int, a: int, b: int, y0: float, mean: float) -> None:
    svg.rect(x0 + a * cell + 2, y0, (b - a) * cell - 4, 30, fill=WINDOW_COLOURS[j],
             opacity=0.55, stroke=WINDOW_COLOURS[j], width=2, rx=4)
    svg.text(x0 + (a + b) * cell / 2, y0 + 20, f"[{a}, {b}) → {num(mean)}", size=13,
             weight="bold")

  top = 84
  svg.text(24, top - 12, "PyTorch, Keras 3 and nnx-pool: bin i = [floor(i·L/T), ceil((i+1)·L/T))",
           size=14, anchor="start", fill=INK, weight="bold")
  cell_row(top, shade=True)
  for i in shared:
    cx = x0 + i * cell + cell / 2
    svg.line(cx, top + cell, cx, top + cell + 12 + 4 * 36, stroke=WARN, width=1.5, dash="4 3")
  for j, (a, b) in enumerate(bins):
    bar(j, a, b, top + cell + 12 + j * 36, float(means[j]))

  top2 = top + cell + 12 + 4 * 36 + 56
  svg.text(24, top2 - 12, "Equinox: first L mod T bins get one extra cell, no overlap",
           size=14, anchor="start", fill=INK, weight="bold")
  cell_row(top2, shade=False)
  for j, (a, b) in enumerate(eqx):
    bar(j, a, b, top2 + cell + 12, eqx_means[j])

  _caption(svg, top2 + cell + 84, [
      f"Shaded cells {', '.join(map(str, shared))} fall in two PyTorch bins (dashed lines) "
      "and get gradient from both.",
      "Top: bins and means computed by nnx_pool.AdaptiveAvgPool. Bottom: Equinox's rule, "
      "restated from its",
      "source (Equinox is not run); the means are plain NumPy.",
  ])
  return svg.render()


# ----------------------------------------------------------------------------
# The registry.
# ----------------------------------------------------------------------------

FIGURES: dict[str, Callable[[], str]] = {
    "01-average-pooling.svg": figure_average_pooling,
    "02-same-padding.svg": figure_same_padding,
    "03-max-pooling.svg": figure_max_pooling,
    "04-global-pooling-and-se.svg": figure_global_pooling_and_se,
    "05-adaptive-pooling.svg": figure_adaptive_pooling,
}


def render_all() -> dict[str, str]:
  """Every figure's SVG text, by file name, computed now (nothing is written)."""
  return {name: draw() for name, draw in FIGURES.items()}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true",
                      help="compare with the committed figures instead of writing them")
  args = parser.parse_args(argv)
  rendered = render_all()
  if args.check:
    stale = [n for n, t in rendered.items()
             if not (FIGURES_DIR / n).exists()
             or (FIGURES_DIR / n).read_text(encoding="utf-8") != t]
    for name in stale:
      print(f"stale: guides/figures/{name}")
    return 1 if stale else 0
  FIGURES_DIR.mkdir(exist_ok=True)
  for name, text in rendered.items():
    (FIGURES_DIR / name).write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote guides/figures/{name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
