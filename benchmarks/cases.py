"""Benchmark cases: each pairs an nnx_pool module with its flax.nnx and PyTorch peers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from flax import nnx

import nnx_pool


@dataclasses.dataclass(frozen=True)
class Case:
  """One benchmark row.

  ``ours`` builds the function under test; ``flax`` is the peer with the same
  numbers; ``torch`` takes the torch module and returns a function of an
  NCHW-shaped channels_last tensor.
  """

  name: str
  shape: tuple[int, ...]
  ours: Callable[[], Callable]
  flax: Callable
  torch: Callable | None = None

  @property
  def ndim(self) -> int:
    return len(self.shape) - 2

  def tiny(self) -> Case:
    """The same case on a small input, for the smoke test."""
    n, *spatial, c = self.shape
    return dataclasses.replace(self, shape=(1, *(min(s, 9) for s in spatial), min(c, 4)))


def _pad(p):
  return ((p, p), (p, p))


CASES = [
    Case(
        "MaxPool 3x3/2 pad 1",
        (8, 112, 112, 64),
        lambda: nnx_pool.MaxPool((3, 3), 2, 1),
        lambda x: nnx.max_pool(x, (3, 3), (2, 2), _pad(1)),
        lambda torch: lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1),
    ),
    Case(
        "MaxPool 2x2/2",
        (8, 56, 56, 256),
        lambda: nnx_pool.MaxPool((2, 2)),
        lambda x: nnx.max_pool(x, (2, 2), (2, 2)),
        lambda torch: lambda x: torch.nn.functional.max_pool2d(x, 2, 2),
    ),
    Case(
        "MaxPool 3x3/1 pad 1",
        (8, 56, 56, 64),
        lambda: nnx_pool.MaxPool((3, 3), 1, 1),
        lambda x: nnx.max_pool(x, (3, 3), (1, 1), _pad(1)),
        lambda torch: lambda x: torch.nn.functional.max_pool2d(x, 3, 1, 1),
    ),
    Case(
        "AvgPool 2x2/2",
        (8, 112, 112, 64),
        lambda: nnx_pool.AvgPool((2, 2)),
        lambda x: nnx.avg_pool(x, (2, 2), (2, 2)),
        lambda torch: lambda x: torch.nn.functional.avg_pool2d(x, 2, 2),
    ),
    Case(
        "AvgPool 3x3/1 pad 1 excl. pad",
        (8, 112, 112, 64),
        lambda: nnx_pool.AvgPool((3, 3), 1, 1, count_include_pad=False),
        lambda x: nnx.avg_pool(x, (3, 3), (1, 1), _pad(1), count_include_pad=False),
        lambda torch: lambda x: torch.nn.functional.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
    ),
]
