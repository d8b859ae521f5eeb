"""Draws the guides' figures with matplotlib, from numbers the library computes.

Usage::

    python guides/make_figures.py          # (re)write guides/figures/*.svg
    python guides/make_figures.py --check  # exit 1 if a committed figure is stale

Every number drawn (pooled values, indices, gradients, sums, divisors, bins) comes
from calling nnx-pool on the guide's input; only the layout is written here. Each
figure is one matplotlib ``Figure`` (no pyplot, no global state) whose single axes
spans it in points, y pointing down. ``render`` saves it under fixed rcParams and no
date, so one library and one matplotlib give the same bytes, and
``tests/test_guides.py`` can compare the committed files with a fresh rendering.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import matplotlib.style
import numpy as np
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LinearSegmentedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

FIGURES_DIR = Path(__file__).resolve().parent / "figures"

INK = "#222222"
MUTED = "#666666"
GRID = "#9a9a9a"
FADED = "#b5b5b5"
# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
WINDOW_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7")
ACCENT = "#0072B2"
WARN = "#D55E00"
FILL_ALPHA = 0.45

RC = {
    # Ids of clip paths and images are hashes salted with this, not with a uuid4.
    "svg.hashsalt": "nnx-pool guides",
    # Text stays <text>: the files stay small, numbers can be searched and read aloud,
    # and no glyph outlines change with the font build. Layout uses DejaVu Sans,
    # which matplotlib ships, so positions do not depend on the system's fonts.
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial"],
    "hatch.linewidth": 2.0,
}


def num(value) -> str:
  """A data value for display: shortest exact form, with a typographic minus."""
  value = float(value)
  if np.isnan(value):
    return "NaN"
  return f"{value:.6g}".replace("-", "\u2212")


# ----------------------------------------------------------------------------
# Drawing helpers. Coordinates are points from the top-left corner.
# ----------------------------------------------------------------------------


def _canvas(width: int, height: int) -> tuple[Figure, Axes]:
  """A white figure of ``width`` by ``height`` points and one axes over all of it."""
  fig = Figure(figsize=(width / 72, height / 72), dpi=72, facecolor="white")
  ax = fig.add_axes((0, 0, 1, 1))
  ax.set_xlim(0, width)
  ax.set_ylim(height, 0)
  ax.set_autoscale_on(False)
  ax.set_axis_off()
  return fig, ax


def _text(ax: Axes, x, y, content: str, *, size=14, ha="center", va="baseline",
          colour=INK, **kwargs) -> None:
  ax.text(x, y, content, fontsize=size, ha=ha, va=va, color=colour, **kwargs)


def _label(ax: Axes, x, y, content: str, *, size=13, colour=MUTED, **kwargs) -> None:
  """Left-aligned text, muted unless told otherwise."""
  _text(ax, x, y, content, size=size, ha="left", colour=colour, **kwargs)


def _heading(ax: Axes, content: str) -> None:
  _label(ax, 24, 32, content, size=17, colour=INK, weight="bold")


def _caption(ax: Axes, y, lines: Sequence[str]) -> None:
  for i, line in enumerate(lines):
    _label(ax, 24, y + 18 * i, line)


def _box(ax: Axes, x, y, w, h, **kwargs) -> None:
  """A rectangle with its top-left corner at (x, y); no fill or edge unless given."""
  kwargs.setdefault("facecolor", "none")
  kwargs.setdefault("edgecolor", "none")
  ax.add_patch(Rectangle((x, y), w, h, clip_on=False, **kwargs))


def _cell(ax: Axes, x, y, side, colours: Sequence[str] = ()) -> None:
  """A square grid cell; several colours fill it in vertical slices."""
  for k, colour in enumerate(colours):
    _box(ax, x + k * side / len(colours), y, side / len(colours), side,
         facecolor=(colour, FILL_ALPHA))
  _box(ax, x, y, side, side, edgecolor=GRID, linewidth=1)


def _grid(ax: Axes, x0, y0, values: np.ndarray, cell: float, *, fills=None, size=18,
          weight="normal", index_labels=False, text_colours=None) -> None:
  """A grid of square cells holding ``values``; ``fills[r][c]`` lists a cell's colours."""
  rows, cols = values.shape
  for r in range(rows):
    for c in range(cols):
      x, y = x0 + c * cell, y0 + r * cell
      _cell(ax, x, y, cell, colours=fills[r][c] if fills is not None else ())
      colour = INK if text_colours is None else text_colours[r][c]
      _text(ax, x + cell / 2, y + cell / 2, num(values[r, c]), size=size, weight=weight,
            va="center_baseline", colour=colour)
      if index_labels:
        _text(ax, x + cell - 7, y + cell - 7, str(r * cols + c), size=10, ha="right",
              colour=MUTED)


def _outline(ax: Axes, x0, y0, cell, r0, c0, h, w, colour, inset) -> None:
  """A window of ``h`` by ``w`` cells from cell (r0, c0), outlined inside its cells."""
  ax.add_patch(FancyBboxPatch(
      (x0 + c0 * cell + inset, y0 + r0 * cell + inset), w * cell - 2 * inset,
      h * cell - 2 * inset, boxstyle="round,pad=0,rounding_size=3", facecolor="none",
      edgecolor=colour, alpha=0.9, linewidth=3.5, zorder=2, clip_on=False))


def _arrow(ax: Axes, x1, y1, x2, y2, *, width=1.5) -> None:
  ax.annotate("", (x2, y2), (x1, y1), annotation_clip=False, arrowprops=dict(
      arrowstyle="-|>", color=MUTED, linewidth=width, shrinkA=0, shrinkB=0,
      mutation_scale=14))


# ----------------------------------------------------------------------------
# Guide 1: average pooling.
# ----------------------------------------------------------------------------


def figure_average_pooling() -> Figure:
  from nnx_pool import AvgPool

  x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
  y = np.asarray(AvgPool((2, 2))(x))[0, ..., 0]
  grid = x[0, ..., 0]

  fig, ax = _canvas(660, 400)
  _heading(ax, "AvgPool((2, 2)) on x = arange(16).reshape(1, 4, 4, 1)")
  cell, x0, y0 = 60, 24, 84
  fills = [[[WINDOW_COLOURS[(r // 2) * 2 + c // 2]] for c in range(4)] for r in range(4)]
  _label(ax, x0, y0 - 12, "input x[0, :, :, 0]  (H = W = 4)")
  _grid(ax, x0, y0, grid, cell, fills=fills)
  for k in range(4):
    _outline(ax, x0, y0, cell, 2 * (k // 2), 2 * (k % 2), 2, 2, WINDOW_COLOURS[k], 3)

  ox, ocell = 400, 120
  mid = (x0 + 4 * cell + ox) / 2
  _arrow(ax, x0 + 4 * cell + 18, y0 + 2 * cell, ox - 18, y0 + 2 * cell, width=2)
  _text(ax, mid, y0 + 2 * cell - 12, "mean of each", size=13, colour=MUTED)
  _text(ax, mid, y0 + 2 * cell + 22, "2×2 window", size=13, colour=MUTED)
  _label(ax, ox, y0 - 12, "output y[0, :, :, 0]  (2×2)")
  for r in range(2):
    for c in range(2):
      cx, cy = ox + c * ocell, y0 + r * ocell
      _cell(ax, cx, cy, ocell, colours=[WINDOW_COLOURS[r * 2 + c]])
      _text(ax, cx + ocell / 2, cy + ocell / 2 + 4, num(y[r, c]), size=24, weight="bold")
      window = grid[2 * r:2 * r + 2, 2 * c:2 * c + 2].ravel()
      _text(ax, cx + ocell / 2, cy + ocell / 2 + 24,
            "(" + "+".join(num(v) for v in window) + ")/4", size=12)
  _caption(ax, 350, [
      "Each colour is one window (stride = window = 2, VALID): the output cell of the same colour",
      "is the mean of the four input cells inside it. Values computed by nnx_pool.AvgPool.",
  ])
  return fig


# ----------------------------------------------------------------------------
# Guide 2: SAME padding and count_include_pad.
# ----------------------------------------------------------------------------


def _pad_cell(ax: Axes, x, y, w) -> None:
  """A hatched square cell: padding."""
  _box(ax, x, y, w, w, facecolor="#f2f2f2", edgecolor="#c8c8c8", hatch="//", linewidth=0)
  _cell(ax, x, y, w)


def figure_same_padding() -> Figure:
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

  fig, ax = _canvas(760, 580)
  _heading(ax, 'AvgPool((2, 2), strides=1, padding="SAME") on [[1, 2], [3, 4]]')
  _label(ax, 24, 54, f"SAME pads (low, high) = ({lo}, {hi}) per dim: the extra cell goes on the "
         "bottom and the right.")
  cell, top, left, gap = 46, 100, 24, 50
  for k in range(4):
    r, c = divmod(k, 2)
    px = left + k * (size * cell + gap)
    _text(ax, px + size * cell / 2, top - 12, f"output [{r}, {c}]", weight="bold")
    for i in range(size):
      for j in range(size):
        cx, cy = px + j * cell, top + i * cell
        if is_pad[i, j]:
          _pad_cell(ax, cx, cy, cell)
          _text(ax, cx + cell / 2, cy + cell / 2, "pad", size=12, va="center_baseline",
                colour=MUTED, style="italic")
        else:
          in_window = r <= i < r + 2 and c <= j < c + 2
          _cell(ax, cx, cy, cell, colours=[WINDOW_COLOURS[k]] if in_window else ())
          _text(ax, cx + cell / 2, cy + cell / 2, num(padded[i, j]), size=17,
                va="center_baseline")
    _outline(ax, px, top, cell, r, c, 2, 2, WINDOW_COLOURS[k], 2)
    ty = top + size * cell + 24
    _label(ax, px, ty, f"sum = {num(sums[r, c])}", size=14, colour=INK)
    _label(ax, px, ty + 22, f"True:  ÷ 4 = {num(include[r, c])}", size=14, colour=ACCENT)
    _label(ax, px, ty + 44, f"False: ÷ {num(real[r, c])} = {num(exclude[r, c])}", size=14,
           colour=WARN)

  gy, gcell = 360, 56
  fills = [[[WINDOW_COLOURS[r * 2 + c]] for c in range(2)] for r in range(2)]
  for title, values, colour, gx in (
      ("count_include_pad=True (default, Flax)", include, ACCENT, 90),
      ("count_include_pad=False (Keras, TF)", exclude, WARN, 440),
  ):
    _label(ax, gx, gy - 12, title, size=14, colour=colour, weight="bold")
    _grid(ax, gx + 40, gy, values, gcell, fills=fills, weight="bold")
  _pad_cell(ax, 24, 496, 20)
  _label(ax, 52, 511, "SAME padding (zeros)")
  _caption(ax, 540, [
      "True divides every window by its 4 cells; False divides by the real cells only.",
      "Values computed by nnx_pool.AvgPool (sums with divisor_override=1).",
  ])
  return fig


# ----------------------------------------------------------------------------
# Guide 3: max pooling, indices and the gradient.
# ----------------------------------------------------------------------------

SEED_GRID = np.array(
    [[1, 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]], dtype=np.float32
)


def _max_row(ax: Axes, y0: float, window: int, stride: int, label: str) -> None:
  from nnx_pool import MaxPool

  x = SEED_GRID.reshape(1, 4, 4, 1)
  weights = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32).reshape(1, 2, 2, 1)
  pool = MaxPool((window, window), strides=stride, return_indices=True)
  values, indices = (np.asarray(a)[0, ..., 0] for a in pool(x))
  grad = np.asarray(jax.grad(
      lambda g: jnp.sum(MaxPool((window, window), strides=stride)(g) * weights))(x))[0, ..., 0]
  if values.shape != (2, 2):
    raise RuntimeError(f"the layout below draws a 2x2 output, got {values.shape}")

  winners: list[list[list[str]]] = [[[] for _ in range(4)] for _ in range(4)]
  for k in range(4):
    r, c = divmod(int(indices[k // 2, k % 2]), 4)
    winners[r][c].append(WINDOW_COLOURS[k])

  cell, x0 = 52, 24
  _label(ax, x0, y0 - 34, label, size=15, colour=INK, weight="bold")
  _label(ax, x0, y0 - 12, "input; small numbers: flat index h·W + w", size=12)
  _grid(ax, x0, y0, SEED_GRID, cell, fills=winners, size=17, index_labels=True)
  insets = (3, 6, 9, 12) if stride < window else (3, 3, 3, 3)
  for k in range(4):
    r, c = divmod(k, 2)
    _outline(ax, x0, y0, cell, r * stride, c * stride, window, window, WINDOW_COLOURS[k],
             insets[k])

  px, pcell = 330, 74
  _arrow(ax, x0 + 4 * cell + 12, y0 + 2 * cell, px - 12, y0 + 2 * cell, width=2)
  _label(ax, px, y0 - 12, "values, indices", size=12)
  for r in range(2):
    for c in range(2):
      cx, cy = px + c * pcell, y0 + 30 + r * pcell
      _cell(ax, cx, cy, pcell, colours=[WINDOW_COLOURS[r * 2 + c]])
      _text(ax, cx + pcell / 2, cy + pcell / 2 + 2, num(values[r, c]), size=20,
            weight="bold")
      _text(ax, cx + pcell / 2, cy + pcell / 2 + 22, f"index {int(indices[r, c])}", size=11)

  gx = 560
  _arrow(ax, px + 2 * pcell + 12, y0 + 2 * cell, gx - 12, y0 + 2 * cell, width=2)
  _label(ax, gx, y0 - 12, "∂/∂x of Σ w·y, w = [[1, 2], [3, 4]]", size=12)
  text_colours = [[INK if grad[r, c] else FADED for c in range(4)] for r in range(4)]
  _grid(ax, gx, y0, grad, cell, fills=winners, size=17, weight="bold",
        text_colours=text_colours)


def figure_max_pooling() -> Figure:
  fig, ax = _canvas(800, 700)
  _heading(ax, "MaxPool on the 4×4 grid: the winners, their indices, and the gradient")
  _max_row(ax, 110, 2, 2, "MaxPool((2, 2)): stride 2, windows do not overlap")
  _max_row(ax, 400, 3, 1, "MaxPool((3, 3), strides=1): windows overlap, a cell can win twice")
  _caption(ax, 650, [
      "Filled cells won their window (colour = window; split fill = won two windows). The gradient",
      "of each output lands on its winner only, and adds up where one cell wins twice (1+2, 3+4).",
  ])
  return fig


# ----------------------------------------------------------------------------
# Guide 4: global pooling and a squeeze-excitation gate.
# ----------------------------------------------------------------------------

SE_STATE = {  # guides/04: torchvision SqueezeExcitation(4, 2) layout, as NumPy arrays
    "fc1.weight": np.array([[1, 0, -1, 0], [0, 0, 0, 1]], dtype=np.float32).reshape(2, 4, 1, 1),
    "fc1.bias": np.array([0, -1], dtype=np.float32),
    "fc2.weight": np.array([[5, 0], [0, 1], [0, -1], [0, 2]], dtype=np.float32).reshape(4, 2, 1, 1),
    "fc2.bias": np.zeros(4, dtype=np.float32),
}
# Blue below zero, white at zero, orange above: linear in RGB.
DIVERGING = LinearSegmentedColormap.from_list("nnx_pool_diverging",
                                              [ACCENT, "#ffffff", WINDOW_COLOURS[0]])


def striped_map() -> np.ndarray:
  """guides/04's (1, 12, 20, 4) input: channel c is c plus stripes of mean zero."""
  h, w = np.meshgrid(np.arange(12), np.arange(20), indexing="ij")
  stripes = (h + 2 * w) % 5 - 2
  return np.stack([c + stripes for c in range(4)], axis=-1).astype(np.float32)[None]


def figure_global_pooling_and_se() -> Figure:
  from nnx_pool import GlobalAvgPool, SqueezeExcitation

  x = striped_map()
  pooled = np.asarray(GlobalAvgPool()(x))[0]
  se = SqueezeExcitation.from_torch(SE_STATE)
  y = np.asarray(se(x))[0]
  scale = np.asarray(se.gate(se.fc2(se.activation(se.fc1(GlobalAvgPool()(x))))))[0]
  vmax = float(np.abs(x).max())
  norm = Normalize(-vmax, vmax)

  fig, ax = _canvas(900, 610)
  _heading(ax, "SqueezeExcitation.from_torch(state_dict) on a (1, 12, 20, 4) map")
  cell, top, pitch = 6, 92, 98
  in_x, out_x = 24, 716
  pool_x, scale_x, box = 300, 500, 64
  _label(ax, in_x, top - 22, "input x, channel c")
  _label(ax, pool_x - 8, top - 22, "GlobalAvgPool")
  _label(ax, scale_x - 30, top - 22, "fc1, ReLU, fc2, sigmoid")
  _label(ax, out_x, top - 22, "output x · scale[c]")

  def heatmap(left, y0, plane):
    # Each value one pixel, scaled up without smoothing.
    ax.imshow(plane, cmap=DIVERGING, norm=norm, interpolation="none", aspect="auto",
              extent=(left, left + 20 * cell, y0 + 12 * cell, y0))
    _box(ax, left, y0, 20 * cell, 12 * cell, edgecolor=GRID)

  for c in range(4):
    y0 = top + c * pitch
    mid = y0 + 6 * cell
    _label(ax, in_x, y0 - 5, f"c = {c}", size=12, colour=INK)
    heatmap(in_x, y0, x[0, ..., c])
    _arrow(ax, in_x + 20 * cell + 10, mid, pool_x - 10, mid)
    _box(ax, pool_x, mid - box / 2, box, box, facecolor=DIVERGING(norm(pooled[c])),
         edgecolor=GRID)
    _text(ax, pool_x + box / 2, mid, num(pooled[c]), size=20, weight="bold",
          va="center_baseline")
    _arrow(ax, pool_x + box + 10, mid, scale_x - 10, mid)
    _box(ax, scale_x, mid - box / 2, box + 16, box,
         facecolor=(ACCENT, 0.15 + 0.6 * float(scale[c])), edgecolor=GRID)
    _text(ax, scale_x + (box + 16) / 2, mid, f"{float(scale[c]):.3f}", size=18,
          weight="bold", va="center_baseline")
    _arrow(ax, scale_x + box + 26, mid, out_x - 10, mid)
    heatmap(out_x, y0, y[..., c])

  legend_y = top + 4 * pitch + 6
  width, height = fig.bbox.width, fig.bbox.height
  cax = fig.add_axes((24 / width, 1 - (legend_y + 14) / height, 340 / width, 14 / height))
  bar = fig.colorbar(ScalarMappable(norm, DIVERGING), cax=cax, orientation="horizontal",
                     ticks=[-vmax, 0, vmax])
  bar.ax.set_xticklabels([num(v) for v in (-vmax, 0, vmax)], fontsize=12, color=MUTED)
  bar.outline.set_edgecolor(GRID)
  _label(ax, 400, legend_y + 12, "one colour scale for input and output maps")
  _caption(ax, legend_y + 52, [
      "Each channel is c plus stripes of mean zero, so GlobalAvgPool gives exactly 0, 1, 2, 3.",
      "The gate maps them to sigmoid([0, 2, -2, 4]) and multiplies each channel by its scale;",
      "channel 2 fades to 0.119 of itself. Weights from a NumPy state dict; values from nnx_pool.",
  ])
  return fig


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


def figure_adaptive_pooling() -> Figure:
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
  fig, ax = _canvas(760, 560)
  _heading(ax, "AdaptiveAvgPool((4,)) on arange(14): where the four bins fall")

  def cell_row(y0: float, shade: bool) -> None:
    for i in range(length):
      if shade and i in shared:
        _box(ax, x0 + i * cell, y0, cell, cell, facecolor=(WARN, 0.18))
      _cell(ax, x0 + i * cell, y0, cell)
      _text(ax, x0 + i * cell + cell / 2, y0 + cell / 2, num(values[i]), size=16,
            va="center_baseline")

  def bar(j: int, a: int, b: int, y0: float, mean: float) -> None:
    ax.add_patch(FancyBboxPatch(
        (x0 + a * cell + 2, y0), (b - a) * cell - 4, 30, boxstyle="round,pad=0,rounding_size=4",
        facecolor=(WINDOW_COLOURS[j], 0.55), edgecolor=WINDOW_COLOURS[j], linewidth=2,
        clip_on=False))
    _text(ax, x0 + (a + b) * cell / 2, y0 + 15, f"[{a}, {b}) → {num(mean)}", size=13,
          weight="bold", va="center_baseline")

  top = 84
  _label(ax, 24, top - 12, "PyTorch, Keras 3 and nnx-pool: bin i = [floor(i·L/T), ceil((i+1)·L/T))",
         size=14, colour=INK, weight="bold")
  cell_row(top, shade=True)
  for i in shared:
    cx = x0 + i * cell + cell / 2
    # Under the bars, as the bars are drawn over the cells they cover.
    ax.plot([cx, cx], [top + cell, top + cell + 12 + 4 * 36], color=WARN, linewidth=1.5,
            linestyle=(0, (4, 3)), clip_on=False, zorder=0.5)
  for j, (a, b) in enumerate(bins):
    bar(j, a, b, top + cell + 12 + j * 36, float(means[j]))

  top2 = top + cell + 12 + 4 * 36 + 56
  _label(ax, 24, top2 - 12, "Equinox: first L mod T bins get one extra cell, no overlap",
         size=14, colour=INK, weight="bold")
  cell_row(top2, shade=False)
  for j, (a, b) in enumerate(eqx):
    bar(j, a, b, top2 + cell + 12, eqx_means[j])

  _caption(ax, top2 + cell + 84, [
      f"Shaded cells {', '.join(map(str, shared))} fall in two PyTorch bins (dashed lines) "
      "and get gradient from both.",
      "Top: bins and means computed by nnx_pool.AdaptiveAvgPool. Bottom: Equinox's rule, "
      "restated from its",
      "source (Equinox is not run); the means are plain NumPy.",
  ])
  return fig


# ----------------------------------------------------------------------------
# The registry.
# ----------------------------------------------------------------------------


class Drawing(NamedTuple):
  """A figure's drawing function, and the title and description saved with it."""

  draw: Callable[[], Figure]
  title: str
  description: str


FIGURES: dict[str, Drawing] = {
    "01-average-pooling.svg": Drawing(
        figure_average_pooling, "AvgPool((2, 2)) on arange(16)",
        "A 4 by 4 input with four 2 by 2 windows, each averaged to one output cell."),
    "02-same-padding.svg": Drawing(
        figure_same_padding, "SAME padding: count_include_pad True versus False",
        "Four windows over a 2 by 2 input padded on the high side, with both divisors."),
    "03-max-pooling.svg": Drawing(
        figure_max_pooling, "MaxPool: argmax cells and where the gradient lands",
        "Two rows: 2 by 2 windows at stride 2, then overlapping 3 by 3 windows at stride 1."),
    "04-global-pooling-and-se.svg": Drawing(
        figure_global_pooling_and_se, "Global average pooling and a squeeze-excitation gate",
        "Four 12 by 20 channels, their means, the gate scale, and the scaled channels."),
    "05-adaptive-pooling.svg": Drawing(
        figure_adaptive_pooling, "Adaptive average pooling: PyTorch bins versus Equinox bins",
        "Fourteen cells pooled to four outputs by two different binning rules."),
}


def render(name: str) -> bytes:
  """Figure ``name`` drawn now, as SVG without a date (nothing is written)."""
  drawing = FIGURES[name]
  # Artists read some rcParams when created and the SVG writer others when saving;
  # "default" first, so that a user's matplotlibrc changes nothing.
  with matplotlib.style.context(["default", RC]):
    buffer = io.BytesIO()
    drawing.draw().savefig(buffer, format="svg", metadata={
        "Date": None, "Title": drawing.title, "Description": drawing.description,
    })
  return buffer.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true",
                      help="compare with the committed figures instead of writing them")
  args = parser.parse_args(argv)
  rendered = {name: render(name) for name in FIGURES}
  if args.check:
    stale = [n for n, data in rendered.items()
             if not (FIGURES_DIR / n).exists() or (FIGURES_DIR / n).read_bytes() != data]
    for name in stale:
      print(f"stale: guides/figures/{name}")
    return 1 if stale else 0
  FIGURES_DIR.mkdir(exist_ok=True)
  for name, data in rendered.items():
    (FIGURES_DIR / name).write_bytes(data)
    print(f"wrote guides/figures/{name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
