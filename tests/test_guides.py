"""The guides' figures, links and index, and the PyTorch numbers they quote.

The code blocks of ``guides/*.md`` run through Sybil (see the root conftest.py);
this file checks what Sybil cannot: that every committed figure is exactly what
``guides/make_figures.py`` draws from the current library, that every figure and
link resolves, that the index lists every guide, and, when torch is installed,
that the values the guides attribute to PyTorch are PyTorch's.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib
import numpy as np
import pytest

GUIDES = Path(__file__).resolve().parent.parent / "guides"
FIGURES = GUIDES / "figures"
REGENERATE = "python guides/make_figures.py"


def _load_make_figures():
  spec = importlib.util.spec_from_file_location("_guides_make_figures", GUIDES / "make_figures.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


make_figures = _load_make_figures()
GUIDE_FILES = sorted(GUIDES.glob("[0-9][0-9]-*.md"))
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _prose(page: Path) -> str:
  """A page without its fenced blocks and inline code, where brackets are not links."""
  text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
  return re.sub(r"`[^`]*`", "", text)


@functools.cache
def _render(name: str) -> bytes:
  """One figure drawn now (each separately, so one broken drawing fails only its tests)."""
  return make_figures.render(name)


def _texts(svg: bytes) -> list[str]:
  """Every text a figure shows, in drawing order: its values, labels and captions."""
  root = ET.fromstring(svg)
  return ["".join(t.itertext()).strip() for t in root.iter("{http://www.w3.org/2000/svg}text")]


def _pinned_matplotlib() -> str | None:
  for line in (GUIDES.parent / "constraints.txt").read_text().splitlines():
    if line.startswith("matplotlib=="):
      return line.split("==", 1)[1].strip()
  return None


@pytest.mark.parametrize("name", sorted(make_figures.FIGURES))
def test_guides_committed_figure_shows_what_the_library_computes(name):
  # The data a figure plots are its numbers and labels (text elements, kept as text by
  # svg.fonttype "none"): they must be what guides/make_figures.py draws from the current
  # library, whatever matplotlib draws them with.
  path = FIGURES / name
  assert path.exists(), f"guides/figures/{name} is missing; generate it with `{REGENERATE}`."
  committed, drawn = _texts(path.read_bytes()), _texts(_render(name))
  assert len(committed) > 10
  if committed != drawn:
    first = next((i for i, (a, b) in enumerate(zip(committed, drawn, strict=False)) if a != b),
                 min(len(committed), len(drawn)))
    pytest.fail(
        f"guides/figures/{name} shows other values than guides/make_figures.py draws from "
        f"the current library (text {first}: {committed[first:first + 1]} vs "
        f"{drawn[first:first + 1]}). If the change is intended, regenerate with "
        f"`{REGENERATE}` and review the new figure.", pytrace=False)


@pytest.mark.skipif(matplotlib.__version__ != _pinned_matplotlib(),
                    reason=f"the committed SVG bytes are those of matplotlib "
                    f"{_pinned_matplotlib()} (constraints.txt); this is {matplotlib.__version__}")
@pytest.mark.parametrize("name", sorted(make_figures.FIGURES))
def test_guides_committed_figure_matches_rendering(name):
  # With the pinned matplotlib, the drawing itself (shapes, colours, heat-map pixels) too.
  path = FIGURES / name
  committed = path.read_bytes()
  if committed != _render(name):
    old, new = committed.splitlines(), _render(name).splitlines()
    # The two files may differ in length: stop at the shorter one.
    first = next(
        (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
        min(len(old), len(new)),
    )
    pytest.fail(
        f"guides/figures/{name} differs from what guides/make_figures.py draws from the "
        f"current library (first difference at line {first + 1}). If the change is "
        f"intended, regenerate with `{REGENERATE}` and review the new figure.",
        pytrace=False,
    )


@pytest.mark.parametrize("name", sorted(make_figures.FIGURES))
def test_guides_figure_is_well_formed_svg(name):
  root = ET.fromstring(_render(name))
  ns = {"svg": "http://www.w3.org/2000/svg", "dc": "http://purl.org/dc/elements/1.1/"}
  assert root.tag == "{http://www.w3.org/2000/svg}svg"
  assert root.find("svg:title", ns).text == make_figures.FIGURES[name].title
  assert root.find(".//dc:description", ns).text == make_figures.FIGURES[name].description
  assert root.find(".//dc:date", ns) is None, "a date would make every rendering differ"
  texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
  assert texts, "the text should stay <text> (svg.fonttype 'none')"
  assert "NaN" not in texts


def test_guides_figures_folder_holds_only_generated_figures():
  stray = sorted(p.name for p in FIGURES.iterdir() if p.name not in make_figures.FIGURES)
  assert not stray, (
      f"guides/figures/ holds files make_figures.py does not draw: {stray}. Delete them, "
      f"or add a drawing function to FIGURES and run `{REGENERATE}`."
  )


def test_guides_every_figure_is_used_and_every_image_exists():
  used = set()
  for guide in GUIDE_FILES:
    for target in IMAGE.findall(_prose(guide)):
      assert (guide.parent / target).is_file(), f"{guide.name} shows a missing image {target}"
      used.add(Path(target).name)
  unused = sorted(set(make_figures.FIGURES) - used)
  assert not unused, f"figures that no guide shows: {unused}"


@pytest.mark.parametrize(
    "guide", [g for g in GUIDE_FILES if g.name[:2] in {"01", "02", "03", "04", "05"}],
    ids=lambda g: g.name,
)
def test_guides_one_to_five_show_a_figure(guide):
  assert IMAGE.search(_prose(guide)), f"{guide.name} has no figure"


@pytest.mark.parametrize("page", [*GUIDE_FILES, GUIDES / "README.md"], ids=lambda g: g.name)
def test_guides_relative_links_resolve(page):
  for target in LINK.findall(_prose(page)):
    if "://" in target:
      continue
    assert (page.parent / target).exists(), f"{page.name} links to a missing {target}"


def test_guides_index_lists_every_guide_in_order():
  index = _prose(GUIDES / "README.md")
  linked = [t for t in LINK.findall(index) if re.match(r"\d\d-", t)]
  assert linked == [g.name for g in GUIDE_FILES]


# ----------------------------------------------------------------------------
# Numbers the guides attribute to PyTorch (2.13 CPU), re-checked against torch.
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_functional():
  torch = pytest.importorskip("torch")
  return torch, torch.nn.functional


def test_guides_torch_avg_pool1d_padding_divisors(torch_functional):
  # guides/02-same-padding.md, "Explicit padding follows PyTorch".
  torch, F = torch_functional
  seq = torch.arange(1.0, 6.0).reshape(1, 1, 5)
  np.testing.assert_array_equal(F.avg_pool1d(seq, 3, 1, 1)[0, 0], [1, 2, 3, 4, 3])
  np.testing.assert_array_equal(
      F.avg_pool1d(seq, 3, 1, 1, count_include_pad=False)[0, 0], [1.5, 2, 3, 4, 4.5]
  )


def test_guides_torch_padding_by_hand_counts_the_zeros(torch_functional):
  # guides/02-same-padding.md, "Emulating SAME in PyTorch with F.pad".
  torch, F = torch_functional
  padded = F.pad(torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2), (0, 1, 0, 1))
  for include in (True, False):
    np.testing.assert_array_equal(
        F.avg_pool2d(padded, 2, 1, count_include_pad=include)[0, 0], [[2.5, 1.5], [1.75, 1.0]]
    )


def test_guides_torch_max_pool_values_indices_ties_and_nan(torch_functional):
  # guides/03-max-pooling.md.
  torch, F = torch_functional
  grid = torch.tensor(make_figures.SEED_GRID).reshape(1, 1, 4, 4).requires_grad_()
  values, indices = F.max_pool2d(grid, 2, return_indices=True)
  np.testing.assert_array_equal(values.detach()[0, 0], [[4, 8], [9, -2]])
  np.testing.assert_array_equal(indices[0, 0], [[5, 6], [13, 11]])
  (values * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
  expected = np.zeros(16)
  expected[[5, 6, 13, 11]] = [1, 2, 3, 4]
  np.testing.assert_array_equal(grid.grad[0, 0], expected.reshape(4, 4))
  values3, indices3 = F.max_pool2d(grid.detach(), 3, 1, return_indices=True)
  np.testing.assert_array_equal(values3[0, 0], [[8, 8], [9, 9]])
  np.testing.assert_array_equal(indices3[0, 0], [[6, 6], [13, 13]])

  _, tie = F.max_pool1d(torch.tensor([[[1.0, 3.0, 3.0, 0.0]]]), 4, return_indices=True)
  assert int(tie) == 1
  nan_value, nan_index = F.max_pool1d(
      torch.tensor([[[1.0, float("nan"), 5.0, float("nan")]]]), 4, return_indices=True
  )
  assert torch.isnan(nan_value).all() and int(nan_index) == 3


def test_guides_torch_output_sizes(torch_functional):
  # guides/03-max-pooling.md, "How many outputs".
  torch, F = torch_functional
  grid = torch.zeros(1, 1, 4, 4)
  sides = {(k, s): F.max_pool2d(grid, k, s).shape[-1]
           for k, s in [(2, 2), (3, 1), (2, 1), (4, 1), (1, 1), (3, 2), (1, 3)]}
  assert sides == {(2, 2): 2, (3, 1): 2, (2, 1): 3, (4, 1): 1, (1, 1): 4, (3, 2): 1, (1, 3): 2}
  assert F.max_pool1d(torch.arange(5.0).reshape(1, 1, 5), 2, ceil_mode=True).shape[-1] == 3
  ten = F.max_pool1d(torch.arange(10.0).reshape(1, 1, 10), 1, 2, ceil_mode=True)
  np.testing.assert_array_equal(ten[0, 0], [0, 2, 4, 6, 8])
  with pytest.raises(RuntimeError, match="Output size is too small"):
    F.max_pool2d(grid, 5)


def test_guides_torch_porting_values(torch_functional):
  # guides/06-porting-from-pytorch.md, traps 2 and 4.
  torch, F = torch_functional
  stem = F.max_pool2d(torch.arange(32.0).reshape(1, 2, 4, 4), 3, 2, 1)
  np.testing.assert_array_equal(stem[0], [[[5, 7], [13, 15]], [[21, 23], [29, 31]]])
  ceil = F.avg_pool2d(torch.arange(49.0).reshape(1, 1, 7, 7), 2, 3, ceil_mode=True)
  np.testing.assert_array_equal(ceil[0, 0], [[4, 7, 9.5], [25, 28, 30.5], [42.5, 45.5, 48]])


def test_guides_torch_squeeze_excitation_gate(torch_functional):
  # guides/04-global-pooling-and-se.md: the same state dict through PyTorch.
  torch, F = torch_functional
  from nnx_pool import SqueezeExcitation

  gate = torch.nn.Module()
  gate.fc1, gate.fc2 = torch.nn.Conv2d(4, 2, 1), torch.nn.Conv2d(2, 4, 1)
  gate.load_state_dict({k: torch.from_numpy(v) for k, v in make_figures.SE_STATE.items()})
  x = make_figures.striped_map()
  nchw = torch.from_numpy(x).permute(0, 3, 1, 2)
  with torch.no_grad():
    scale = torch.sigmoid(gate.fc2(F.relu(gate.fc1(nchw.mean((2, 3), keepdim=True)))))
    expected = (nchw * scale).permute(0, 2, 3, 1).numpy()
  np.testing.assert_allclose(scale.flatten(), [0.5, 0.880797, 0.11920292, 0.98201376], rtol=1e-6)
  ours = SqueezeExcitation.from_torch(gate.state_dict())  # torch tensors this time
  np.testing.assert_allclose(ours(x), expected, rtol=1e-6, atol=1e-7)


def test_guides_torch_adaptive_bins(torch_functional):
  # guides/05-adaptive-pooling.md.
  torch, F = torch_functional
  np.testing.assert_array_equal(
      F.adaptive_avg_pool1d(torch.arange(14.0).reshape(1, 1, 14), 4)[0, 0], [1.5, 4.5, 8.5, 11.5]
  )
  np.testing.assert_array_equal(
      F.adaptive_avg_pool2d(torch.arange(35.0).reshape(1, 1, 5, 7), (2, 3))[0, 0],
      [[8, 10, 12], [22, 24, 26]],
  )
  np.testing.assert_array_equal(
      F.adaptive_avg_pool1d(torch.arange(5.0).reshape(1, 1, 5), 8)[0, 0],
      [0, 0.5, 1, 1.5, 2.5, 3, 3.5, 4],
  )
  x = torch.arange(14.0).reshape(1, 1, 14).requires_grad_()
  F.adaptive_avg_pool1d(x, 4).sum().backward()
  expected = np.full(14, 0.25)
  expected[[3, 10]] = 0.5
  np.testing.assert_array_equal(x.grad[0, 0], expected)
