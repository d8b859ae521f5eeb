"""Benchmark cases: each pairs an nnx_pool module with its flax.nnx and PyTorch peers."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
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
  tiny_shape: tuple[int, ...] | None = None
  tiny_case: Case | None = None  # a smaller layer altogether, where a shape is not enough

  @property
  def ndim(self) -> int:
    return len(self.shape) - 2

  def tiny(self) -> Case:
    """The same case on a small input, for the smoke test."""
    if self.tiny_case is not None:
      return self.tiny_case
    n, *spatial, c = self.shape
    shape = self.tiny_shape or (1, *(min(s, 9) for s in spatial), min(c, 4))
    return dataclasses.replace(self, shape=shape)

  def with_batch(self, batch: int) -> Case:
    """The same case at another batch size (the device check's 64 and 256: at the rows'
    own batch a GPU times its launches, not its kernels)."""
    if self.tiny_case is not None:
      return dataclasses.replace(self, shape=(batch, *self.shape[1:]),
                                 tiny_case=self.tiny_case.with_batch(batch))
    return dataclasses.replace(self, shape=(batch, *self.shape[1:]),
                               tiny_shape=(batch, *self.tiny().shape[1:]))

  def size(self) -> int:
    """Elements of the input."""
    return int(np.prod(self.shape))

  def out_size(self) -> int:
    """Elements of the output, from ``ours``'s shape function (nothing is computed)."""
    import jax

    return int(np.prod(jax.eval_shape(self.ours(), jax.ShapeDtypeStruct(
        self.shape, np.float32)).shape))

  def torch_inputs(self, torch, arrays: list[np.ndarray], device: str):
    """PyTorch's function and ``arrays`` as it takes them: NHWC memory seen as NCHW.

    That is exactly PyTorch's ``channels_last`` layout, on ``device``.
    """
    with torch.device(device):  # a case's own weights are made on the device too
      fn = self.torch(torch)
    order = (0, self.ndim + 1, *range(1, self.ndim + 1))
    return fn, [torch.from_numpy(np.array(a)).to(device).permute(*order) for a in arrays]


def _pad(p):
  return ((p, p), (p, p))


@functools.cache
def _se(channels: int) -> nnx_pool.SqueezeExcitation:
  """One gate per width, so ours, the jnp peer and torch share its weights."""
  return nnx_pool.SqueezeExcitation(channels, rngs=nnx.Rngs(0))


def _se_jnp(x):
  se = _se(x.shape[-1])
  k1, b1, k2, b2 = se.fc1.kernel[...], se.fc1.bias[...], se.fc2.kernel[...], se.fc2.bias[...]
  s = jnp.mean(x, axis=(1, 2))
  gate = nnx.sigmoid(nnx.relu(s @ k1 + b1[None]) @ k2 + b2[None])
  return x * gate[:, None, None, :]


def _se_torch(torch, channels: int):
  """timm's SEModule (1x1 convs) holding the same weights as ``_se(channels)``."""
  se = _se(channels)
  to_conv = lambda k: torch.from_numpy(np.array(k).T[:, :, None, None].copy())  # noqa: E731
  w1, b1 = to_conv(se.fc1.kernel[...]), torch.from_numpy(np.array(se.fc1.bias[...]))
  w2, b2 = to_conv(se.fc2.kernel[...]), torch.from_numpy(np.array(se.fc2.bias[...]))
  conv = torch.nn.functional.conv2d
  on = {}  # the weights on each device the input comes on (the GPU check runs on cuda)

  def se(x):
    if x.device not in on:
      on[x.device] = [t.to(x.device) for t in (w1, b1, w2, b2)]
    d1, e1, d2, e2 = on[x.device]
    squeezed = torch.relu(conv(x.mean((2, 3), keepdim=True), d1, e1))
    return x * torch.sigmoid(conv(squeezed, d2, e2))

  return se



@functools.cache
def _attention(channels: int, out: int, heads: int) -> nnx_pool.AttentionPool:
  """One CLIP head per size, so ours, the hand-written Flax head and torch share weights."""
  return nnx_pool.AttentionPool(channels, feat_size=7, out_features=out, num_heads=heads,
                                rngs=nnx.Rngs(0))


def _attention_weights(head: nnx_pool.AttentionPool) -> dict[str, np.ndarray]:
  w = {f"{n}.{p}": np.asarray(getattr(getattr(head, n), p)[...])
       for n in ("q", "k", "v", "proj") for p in ("kernel", "bias")}
  w["pos_embed"] = np.asarray(head.pos_embed[...])
  return w


def _attention_flax(x, channels=2048, out=1024, heads=32):
  """The CLIP head as a Flax user writes it: mean token first, position embedding,
  q/k/v projections and ``nnx.dot_product_attention``, token 0 projected."""
  w = _attention_weights(_attention(channels, out, heads))
  n, h, wd, c = x.shape
  tokens = x.reshape(n, h * wd, c)
  tokens = jnp.concatenate([tokens.mean(axis=1, keepdims=True), tokens], axis=1)
  tokens = tokens + w["pos_embed"][None]

  def project(name):
    y = tokens @ w[f"{name}.kernel"] + w[f"{name}.bias"][None, None]
    return y.reshape(n, -1, heads, c // heads)

  attended = nnx.dot_product_attention(project("q"), project("k"), project("v"))
  return attended[:, 0].reshape(n, c) @ w["proj.kernel"] + w["proj.bias"][None]


def _attention_torch(torch, channels=2048, out=1024, heads=32):
  """timm's ``AttentionPool2d.forward`` (separate q/k/v), with the same weights."""
  w = {k: torch.from_numpy(np.array(v))
       for k, v in _attention_weights(_attention(channels, out, heads)).items()}
  f = torch.nn.functional

  def head(x):  # x: NCHW (channels_last memory)
    n, c = x.shape[:2]
    tokens = x.flatten(2).transpose(1, 2)
    tokens = torch.cat([tokens.mean(1, keepdim=True), tokens], 1) + w["pos_embed"].to(x.device)

    def project(name):
      y = tokens @ w[f"{name}.kernel"].to(x.device) + w[f"{name}.bias"].to(x.device)
      return y.reshape(n, -1, heads, c // heads).transpose(1, 2)

    attended = f.scaled_dot_product_attention(project("q"), project("k"), project("v"))
    token = attended[:, :, 0].reshape(n, c)
    return token @ w["proj.kernel"].to(x.device) + w["proj.bias"].to(x.device)

  return head


def _blur_flax(x):
  """timm's BlurPool2d (3, stride 2, reflect) as a Flax user writes it: reflect padding
  and a depthwise ``nnx.Conv`` holding the binomial filter."""
  return _blur_conv(x.shape[-1])(jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="reflect"))


@functools.cache
def _blur_conv(channels: int) -> nnx.Conv:
  conv = nnx.Conv(channels, channels, (3, 3), strides=2, padding="VALID",
                  feature_group_count=channels, use_bias=False, rngs=nnx.Rngs(0))
  taps = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]) / 16
  # A NumPy kernel, so that a jitted call embeds it: a closed-over jax.Array is hoisted to an
  # argument, which the in-process harness's AOT-compiled call does not pass.
  conv.kernel = nnx.Param(np.broadcast_to(taps.astype(np.float32)[:, :, None, None],
                                          (3, 3, 1, channels)).copy())
  return conv


def _blur_torch(torch):
  """timm 1.0.31 ``BlurPool2d.forward``: ``F.pad`` (reflect) and a grouped conv."""
  taps = torch.tensor([1.0, 2.0, 1.0])
  filt = (taps[:, None] * taps[None, :] / 16)[None, None]

  def blur(x):
    weight = filt.to(x.device).expand(x.shape[1], 1, 3, 3)
    return torch.nn.functional.conv2d(torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect"),
                                      weight, stride=2, groups=x.shape[1])

  return blur


def _median_flax(x):
  """timm's MedianPool2d (3x3, stride 1, reflect 1) as a Flax user writes it: the nine
  shifted views stacked and ``jnp.median``."""
  _, h, w, _ = x.shape
  padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="reflect")
  views = [padded[:, i:i + h, j:j + w] for i in range(3) for j in range(3)]
  return jnp.median(jnp.stack(views, axis=-1), axis=-1)


def _median_torch(torch):
  """timm 1.0.31 ``MedianPool2d.forward``: reflect padding, ``unfold`` twice, ``median``."""
  def median(x):
    x = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect").unfold(2, 3, 1).unfold(3, 3, 1)
    return x.contiguous().view(x.size()[:4] + (-1,)).median(dim=-1)[0]

  return median


@functools.cache
def _samples(n: int, c: int) -> np.ndarray:
  """Fixed ``_random_samples`` for FractionalMaxPool, ``(N, C, 2)`` in [0, 1)."""
  return np.random.default_rng(1).random((n, c, 2), dtype=np.float32)


def _fractional_ours(out: int):
  pool = nnx_pool.FractionalMaxPool(2, out)
  return lambda x: pool(x, samples=jnp.asarray(_samples(x.shape[0], x.shape[-1])))


def _fractional_flax(x, out=28, k=2):
  """PyTorch's fractional max pooling as a Flax user writes it: each plane's interval
  starts from its samples (``floor((i + u) a) - floor(u a)``, the last at ``L - k``),
  then two gathers and a max over each ``k x k`` window."""
  n, h, w, c = x.shape
  u = jnp.asarray(_samples(n, c))

  def starts(sample, length):
    alpha = (length - k) / (out - 1)
    i = jnp.arange(out, dtype=jnp.float32)[None, None]
    first = jnp.floor((i + sample[..., None]) * alpha) - jnp.floor(sample[..., None] * alpha)
    return first.astype(jnp.int32).at[..., -1].set(length - k)

  taps = jnp.arange(k)[None, None, None]
  rows = (starts(u[..., 1], h)[..., None] + taps).reshape(n, c, out * k, 1)
  cols = (starts(u[..., 0], w)[..., None] + taps).reshape(n, c, 1, out * k)
  planes = jnp.take_along_axis(x.transpose(0, 3, 1, 2), rows, axis=2)
  planes = jnp.take_along_axis(planes, cols, axis=3).reshape(n, c, out, k, out, k)
  return planes.max(axis=(3, 5)).transpose(0, 2, 3, 1)


def _fractional_torch(torch, out=28):
  """PyTorch's own ``fractional_max_pool2d`` given the same ``_random_samples``."""
  def pool(x):
    samples = torch.from_numpy(_samples(x.shape[0], x.shape[1])).to(x.device)
    return torch.nn.functional.fractional_max_pool2d(x, 2, output_size=out,
                                                     _random_samples=samples)

  return pool

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
    Case(
        "GlobalAvgPool",
        (32, 7, 7, 512),
        lambda: nnx_pool.GlobalAvgPool(),
        lambda x: jnp.mean(x, axis=(1, 2)),
        lambda torch: lambda x: torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1),
    ),
    Case(
        "AdaptiveAvgPool 56->7",
        (8, 56, 56, 64),
        lambda: nnx_pool.AdaptiveAvgPool(7),
        lambda x: nnx.avg_pool(x, (x.shape[1] // 7,) * 2, (x.shape[1] // 7,) * 2),
        lambda torch: lambda x: torch.nn.functional.adaptive_avg_pool2d(x, 7),
        tiny_shape=(1, 14, 14, 4),
    ),
    Case(
        "SqueezeExcitation C=256",
        (32, 14, 14, 256),
        lambda: _se(256),  # built here, outside any trace, then shared
        _se_jnp,
        lambda torch: _se_torch(torch, 256),
        tiny_shape=(1, 4, 4, 256),
    ),
    Case(
        "AttentionPool CLIP RN50 head",
        (4, 7, 7, 2048),
        lambda: _attention(2048, 1024, 32),
        _attention_flax,
        _attention_torch,
        tiny_case=Case("AttentionPool CLIP RN50 head", (1, 7, 7, 16),
                       lambda: _attention(16, 8, 4),
                       functools.partial(_attention_flax, channels=16, out=8, heads=4),
                       functools.partial(_attention_torch, channels=16, out=8, heads=4)),
    ),
    Case(
        "BlurPool 3/2 reflect",
        (8, 56, 56, 128),
        lambda: nnx_pool.BlurPool(3, 2),
        _blur_flax,
        _blur_torch,
    ),
    Case(
        "MedianPool 3x3/1 reflect 1",
        (8, 56, 56, 64),
        lambda: nnx_pool.MedianPool(3, 1, 1),
        _median_flax,
        _median_torch,
    ),
    Case(
        "FractionalMaxPool 2x2 56->28",
        (8, 56, 56, 64),
        lambda: _fractional_ours(28),
        _fractional_flax,
        _fractional_torch,
        tiny_case=Case("FractionalMaxPool 2x2 56->28", (1, 9, 9, 4), lambda: _fractional_ours(4),
                       functools.partial(_fractional_flax, out=4),
                       functools.partial(_fractional_torch, out=4)),
    ),
]


def by_name(name: str, *, quick: bool = False) -> Case:
  """The row called ``name`` (its tiny form with ``quick``)."""
  for case in CASES:
    if case.name == name:
      return case.tiny() if quick else case
  raise KeyError(f"no benchmark row is called {name!r}; rows: {[c.name for c in CASES]}")
