"""The canonical regression batch: declarative cases over every public module.

Cases come from :data:`BUILDERS`, one function per module family. To cover a new
module, add a function returning its cases to that tuple. :func:`load_batch`
also lists public modules that no case covers, so a module cannot go untested
silently.

Configurations cover every option of each module: window shapes in 1, 2 and
3 dims, default and explicit strides, ``"VALID"``/``"SAME"``/int/pair padding,
dilation, ceil mode, ``count_include_pad``, ``divisor_override``,
``return_indices``, ``in_features``, batched and unbatched inputs, float32,
float16, bfloat16 and integer dtypes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

import nnx_pool
from nnx_pool import (
  CBAM,
  AdaptiveAvgPool,
  AdaptiveMaxPool,
  AttentionPool,
  AttentionPoolLatent,
  AvgPool,
  BlurPool,
  EffectiveSqueezeExcitation,
  EfficientChannelAttention,
  FractionalMaxPool,
  GeMPool,
  GlobalAvgPool,
  GlobalContext,
  GlobalMaxPool,
  LightCBAM,
  LPPool,
  LsePlusPool,
  MaxPool,
  MaxUnpool,
  MedianPool,
  MinPool,
  SelectAdaptivePool,
  SqueezeExcitation,
)

from .declare import Batch, Case, ErrorSpec, call, case
from .inputs import uniform

_CHANNELS_LAST = ErrorSpec("ValueError", r"must be channels-last")
_CHANNELS_FIRST = ErrorSpec("ValueError", r"channels-first")
_NO_GRAD_NONFINITE = "no gradient: the power's derivative at NaN/inf has no documented value"


def _max_cases() -> list[Case]:
  return _select_cases(MaxPool, "max") + [
      case("max_k3s2p1_ceil_asym", call(MaxPool, (3, 3), 2, 1, ceil_mode=True), input="asym",
           tolerance="select"),
      case("max_k2s1_pairs_indices_batch",
           call(MaxPool, (2, 2), 1, ((0, 1), (1, 0)), return_indices=True), input="batch",
           tolerance="select", indices=True),
      case("max_k3s2p1_ceil_indices_unbatched",
           call(MaxPool, (3, 3), 2, 1, ceil_mode=True, return_indices=True, in_features=2),
           input="unbatched", tolerance="select", indices=True),
      case("max_1d_k3s2p1_seq", call(MaxPool, 3, 2, 1, num_spatial_dims=1), input="seq",
           tolerance="select"),
      case("max_k3s2p1_ints_batch", call(MaxPool, 3, 2, 1), input="batch", tolerance="select",
           note="ints repeated over 2 spatial dims: PyTorch's nn.MaxPool2d(3, 2, 1)"),
      case("max_3d_k2_indices_vol", call(MaxPool, (2, 2, 2), return_indices=True), input="vol",
           tolerance="select", indices=True),
      case("max_k3s1_f16_one", call(MaxPool, (3, 3), 1), input="one", dtype="float16",
           tolerance="select"),
      case("max_k3s1p1_int8_ints", call(MaxPool, (3, 3), 1, 1), input="ints", dtype="int8",
           tolerance="select", note="padding holds the int8 minimum"),
      case("max_k2s1_ties_zeros", call(MaxPool, (2, 2), 1, return_indices=True), input="zeros",
           tolerance="select_ties", indices=True,
           note="every window ties: indices pin the first-maximum rule"),
      case("max_nchw", call(MaxPool, (2, 2), in_features=2), input="nchw", tolerance="select",
           raises=_CHANNELS_FIRST),
  ]


def _min_cases() -> list[Case]:
  return _select_cases(MinPool, "min") + [
      case("min_k3s1p2_dil2_asym", call(MinPool, (3, 3), 1, 2, dilation=2), input="asym",
           tolerance="select"),
      case("min_k2_ceil_asym", call(MinPool, (2, 2), ceil_mode=True), input="asym",
           tolerance="select"),
      case("min_k3s1p1_int8_ints", call(MinPool, (3, 3), 1, 1), input="ints", dtype="int8",
           tolerance="select", note="padding holds the int8 maximum"),
  ]


def _select_cases(cls: Any, prefix: str) -> list[Case]:
  """Cases shared by max and min pooling."""
  return [
      case(f"{prefix}_k2_one", call(cls, (2, 2)), input="one", tolerance="select",
           note="strides default to the window"),
      case(f"{prefix}_k3s2_same_batch", call(cls, (3, 3), 2, "SAME"), input="batch",
           tolerance="select"),
      case(f"{prefix}_k2s1_dil2_asym", call(cls, (2, 2), 1, dilation=2), input="asym",
           tolerance="select"),
      case(f"{prefix}_k2_indices_bf16_one", call(cls, (2, 2), return_indices=True), input="one",
           dtype="bfloat16", tolerance="select", indices=True),
      case(f"{prefix}_k2_indices_int32_ints", call(cls, (2, 2), return_indices=True), input="ints",
           dtype="int32", tolerance="select", indices=True),
      case(f"{prefix}_k2_indices_extreme", call(cls, (2, 2), return_indices=True), input="extreme",
           tolerance="select", indices=True),
      case(f"{prefix}_k2_indices_nonfinite", call(cls, (2, 2), return_indices=True),
           input="nonfinite", tolerance="select", indices=True,
           note="NaN propagates and wins; the gradient follows the reported index"),
      case(f"{prefix}_bad_rank", call(cls, (2, 2)), input="bad_rank", tolerance="select",
           raises=_CHANNELS_LAST),
  ]


def _avg_cases() -> list[Case]:
  avg = AvgPool
  return [
      case("avg_k2_one", call(avg, (2, 2)), input="one", note="strides default to the window"),
      case("avg_k3s2_same_batch", call(avg, (3, 3), 2, "SAME"), input="batch"),
      case("avg_k3s2_same_nopad_batch", call(avg, (3, 3), 2, "SAME", count_include_pad=False),
           input="batch"),
      case("avg_k3s2p1_ceil_asym", call(avg, (3, 3), 2, 1, ceil_mode=True), input="asym"),
      case("avg_k3s2p1_ceil_nopad_asym",
           call(avg, (3, 3), 2, 1, ceil_mode=True, count_include_pad=False), input="asym"),
      case("avg_k3s1p1_ints", call(avg, (3, 3), 1, 1), input="ints", tolerance="exact_sum"),
      case("avg_k2_div3_ints", call(avg, (2, 2), divisor_override=3), input="ints",
           tolerance="exact_sum"),
      case("avg_k23_s12_pairs_unbatched",
           call(avg, (2, 3), (1, 2), ((1, 0), (0, 1)), in_features=2), input="unbatched"),
      case("avg_1d_k3s2p1_nopad_seq",
           call(avg, 3, 2, 1, count_include_pad=False, num_spatial_dims=1), input="seq"),
      case("avg_3d_k2s1_vol", call(avg, (2, 2, 2), 1), input="vol"),
      case("avg_k3s2p1_bf16_batch", call(avg, (3, 3), 2, 1), input="batch", dtype="bfloat16"),
      case("avg_k2_f16_batch", call(avg, (2, 2)), input="batch", dtype="float16"),
      case("avg_k2s1_same_zeros", call(avg, (2, 2), 1, "SAME"), input="zeros",
           tolerance="exact_sum"),
      case("avg_k2s1_extreme", call(avg, (2, 2), 1), input="extreme", tolerance="window_rel"),
      case("avg_k2_nonfinite", call(avg, (2, 2)), input="nonfinite",
           note="NaN and inf propagate; inf + -inf in one window gives NaN"),
      case("avg_bad_rank", call(avg, (2, 2)), input="bad_rank", raises=_CHANNELS_LAST),
  ]


def _lp_cases() -> list[Case]:
  lp = LPPool
  return [
      case("lp2_k2_batch", call(lp, 2, (2, 2)), input="batch"),
      case("lp3_k3s2_ceil_positive", call(lp, 3, (3, 3), 2, ceil_mode=True), input="positive",
           note="odd power: positive inputs (negative sums give NaN, as PyTorch)"),
      case("lp1.5_k2s1_positive", call(lp, 1.5, (2, 2), 1), input="positive"),
      case("lp2_1d_k3s2_seq", call(lp, 2, 3, 2, num_spatial_dims=1), input="seq"),
      case("lp2_3d_k2_vol", call(lp, 2, (2, 2, 2)), input="vol"),
      case("lp2_k33s3_unbatched", call(lp, 2, (3, 3), 3, in_features=2), input="unbatched"),
      case("lp2_k2_bf16_batch", call(lp, 2, (2, 2)), input="batch", dtype="bfloat16"),
      case("lp2_k2_nonfinite", call(lp, 2, (2, 2)), input="nonfinite", grad=False,
           note=_NO_GRAD_NONFINITE),
      case("lp2_bad_rank", call(lp, 2, (2, 2)), input="bad_rank", raises=_CHANNELS_LAST),
  ]


def _global_cases() -> list[Case]:
  gap, gmp = GlobalAvgPool, GlobalMaxPool
  return [
      case("global_avg_batch", call(gap), input="batch", tolerance="global"),
      case("global_avg_keepdims_bf16_batch", call(gap, keepdims=True), input="batch",
           dtype="bfloat16", tolerance="global"),
      case("global_avg_1d_seq", call(gap, num_spatial_dims=1, in_features=3), input="seq",
           tolerance="global"),
      case("global_avg_3d_vol", call(gap, num_spatial_dims=3), input="vol", tolerance="global"),
      case("global_avg_unbatched", call(gap), input="unbatched", tolerance="global"),
      case("global_avg_ints", call(gap), input="ints", tolerance="exact_sum",
           note="integer-valued maps give bit-exact means"),
      case("global_avg_bad_rank", call(gap), input="bad_rank", raises=_CHANNELS_LAST),
      case("global_max_batch", call(gmp), input="batch", tolerance="select"),
      case("global_max_keepdims_int8_ints", call(gmp, keepdims=True), input="ints", dtype="int8",
           tolerance="select"),
      case("global_max_ties_zeros", call(gmp), input="zeros", tolerance="select_ties"),
      case("global_max_nonfinite", call(gmp), input="nonfinite", tolerance="select"),
      case("global_max_nchw", call(gmp, in_features=2), input="nchw", tolerance="select",
           raises=_CHANNELS_FIRST),
  ]


def _adaptive_cases() -> list[Case]:
  aap, amp = AdaptiveAvgPool, AdaptiveMaxPool
  # Bins stay within 3x3 cells (5->3 and 7->4 give bins of 2-3), so "window" tolerances hold.
  return [
      case("adaptive_avg_34_asym", call(aap, (3, 4)), input="asym"),
      case("adaptive_avg_up_79_asym", call(aap, (7, 9)), input="asym",
           note="output larger than the input: overlapping one- and two-cell bins"),
      case("adaptive_avg_none3_asym", call(aap, (None, 3)), input="asym"),
      case("adaptive_avg_1d_seq", call(aap, (4,)), input="seq"),
      case("adaptive_avg_3d_vol", call(aap, 2, num_spatial_dims=3), input="vol"),
      case("adaptive_avg_bf16_batch", call(aap, (4, 4)), input="batch", dtype="bfloat16"),
      case("adaptive_avg_34_ints", call(aap, (3, 4)), input="ints", tolerance="exact_sum"),
      case("adaptive_avg_unbatched", call(aap, 3, in_features=2), input="unbatched"),
      case("adaptive_avg_bad_rank", call(aap, (2, 2)), input="bad_rank", raises=_CHANNELS_LAST),
      case("adaptive_max_34_indices_asym", call(amp, (3, 4), return_indices=True), input="asym",
           tolerance="select", indices=True),
      case("adaptive_max_up_79_asym", call(amp, (7, 9)), input="asym", tolerance="select"),
      case("adaptive_max_indices_nonfinite", call(amp, (2, 2), return_indices=True),
           input="nonfinite", tolerance="select", indices=True),
      case("adaptive_max_indices_int32_ints", call(amp, (4, 4), return_indices=True), input="ints",
           dtype="int32", tolerance="select", indices=True),
      case("adaptive_max_ties_zeros", call(amp, (3, 3), return_indices=True), input="zeros",
           tolerance="select_ties", indices=True),
      case("adaptive_max_bf16_one", call(amp, (3, 4)), input="one", dtype="bfloat16",
           tolerance="select"),
      case("adaptive_max_bad_rank", call(amp, (2, 2)), input="bad_rank", tolerance="select",
           raises=_CHANNELS_LAST),
  ]


def _select_adaptive_cases() -> list[Case]:
  sap = SelectAdaptivePool
  return [
      case("select_avg_batch", call(sap), input="batch", tolerance="global"),
      case("select_max_flatten_batch", call(sap, pool_type="max", flatten=True), input="batch",
           tolerance="select"),
      case("select_avgmax_batch", call(sap, pool_type="avgmax"), input="batch", tolerance="global"),
      case("select_catavgmax_flatten_asym", call(sap, 1, pool_type="catavgmax", flatten=True),
           input="asym", tolerance="global"),
      case("select_avg_23_asym", call(sap, (2, 3)), input="asym"),
      case("select_bad_rank", call(sap), input="bad_rank", raises=_CHANNELS_LAST),
  ]


def _pool_then_unpool(pool_cls: Any, pool_args: tuple, unpool_cls: Any, unpool_args: tuple,
                      options: dict) -> Callable[[Any], Any]:
  pool = pool_cls(*pool_args, return_indices=True)
  unpool = unpool_cls(*unpool_args, **options)

  def pool_unpool(x):
    return unpool(*pool(x))

  return pool_unpool


def _bad_indices(unpool_cls: Any, window: tuple) -> Callable[[Any], Any]:
  unpool = unpool_cls(window)

  def unpool_with_own_indices(x):
    return unpool(x, x.astype("int32"))

  return unpool_with_own_indices


def _unpool_cases() -> list[Case]:
  mp, mu = MaxPool, MaxUnpool

  def chain(name: str, pool_args: tuple, unpool_args: tuple, input: str, **fields) -> Case:
    options = fields.pop("options", {})
    shown = ", ".join([repr(a) for a in unpool_args] + [f"{k}={v!r}" for k, v in options.items()])
    pool_shown = ", ".join(repr(a) for a in pool_args)
    return Case(
        name=name, input=input, module="MaxUnpool", tolerance="select",
        build=functools.partial(_pool_then_unpool, mp, pool_args, mu, unpool_args, options),
        config=f"MaxUnpool({shown})(*MaxPool({pool_shown}, return_indices=True)(x))", **fields,
    )

  return [
      chain("unpool_k2_one", ((2, 2),), ((2, 2),), "one"),
      chain("unpool_k3s2p1_asym", ((3, 3), 2, 1), ((3, 3), 2, 1), "asym",
            note="padding 1, stride 2: the default output size restores 5x7"),
      chain("unpool_k3s1_overlap_one", ((3, 3), 1), ((3, 3), 1), "one",
            note="overlapping windows pick the same cell: the last writer wins"),
      chain("unpool_1d_k2_seq", ((2,),), ((2,),), "seq"),
      chain("unpool_k3s2_pairs_asym", (3, 2, ((1, 1), (0, 0))), (3, 2, ((1, 1), (0, 0))), "asym",
            note="MaxPool's (low, high) padding pairs, copied over: the default size is 5x7"),
      chain("unpool_k2_in_features_unbatched", ((2, 2),), ((2, 2),), "unbatched",
            options={"in_features": 2}),
      chain("unpool_k2_bf16_one", ((2, 2),), ((2, 2),), "one", dtype="bfloat16"),
      Case("unpool_bad_rank", functools.partial(_bad_indices, mu, (2, 2)), input="bad_rank",
           module="MaxUnpool", tolerance="select", raises=_CHANNELS_LAST,
           config="MaxUnpool((2, 2))(x, x.astype(int32))"),
  ]


# ---------------------------------------------------------- channel gates
# Weights come from nnx.Rngs(0) at recording and are stored: check loads them,
# so a change in the init PRNG cannot move a number.


def _eval_mode(cls: Any) -> Callable[..., Any]:
  """A factory that builds ``cls`` and switches it to inference (BatchNorm statistics fixed)."""

  def build(*args: Any, **kwargs: Any) -> Any:
    module = cls(*args, **kwargs)
    module.eval()
    return module

  build.__name__ = cls.__name__
  return build


def _gate_cases() -> list[Case]:
  gate: dict[str, Any] = dict(input="gate_map", tolerance="gate", params=True)
  return [
      case("se_gate_map", call(SqueezeExcitation, 8), **gate),
      case("se_s4_hardsigmoid_map", call(SqueezeExcitation, 8, 4, gate=jax.nn.hard_sigmoid),
           **gate),
      case("se_nobias_unbatched", call(SqueezeExcitation, 8, 2, use_bias=False),
           input="gate_map_unbatched", tolerance="gate", params=True),
      case("se_maxpool_norm_eval_gate_map",
           call(_eval_mode(SqueezeExcitation), 8, 2, add_maxpool=True, norm=True), **gate,
           note="timm SEModule's options: squeeze 0.5 * mean + 0.5 * max, BatchNorm after fc1"),
      case("ese_gate_map", call(EffectiveSqueezeExcitation, 8), **gate),
      case("eca_gate_map", call(EfficientChannelAttention, 8), **gate),
      case("eca_k5_gate_map", call(EfficientChannelAttention, 8, 5), **gate),
      case("eca_circular_gate_map", call(EfficientChannelAttention, 8, 3, circular=True),
           **gate, note="timm CecaModule: the first and last channels are neighbours"),
      case("cbam_eval_gate_map", call(_eval_mode(CBAM), 8, 2), **gate),
      case("light_cbam_eval_gate_map",
           call(_eval_mode(LightCBAM), 8, 2, spatial_kernel_size=3), **gate),
      case("gc_fuse_add_gate_map", call(GlobalContext, 8, fuse_add=True, squeeze_features=2),
           **gate, note="attention pooling, then both the additive and the scaling branch"),
      case("se_nchw", call(SqueezeExcitation, 8), input="nchw_gate", params=True, grad=False,
           raises=_CHANNELS_FIRST, tolerance="select"),
  ]


def _attention_cases() -> list[Case]:
  # Each head costs about a second of compiling (building, eager, jit, VJP): one case each.
  return [
      case("attn_pool_token_gate_map", call(AttentionPool, 8, feat_size=(5, 7), num_heads=2),
           input="gate_map", tolerance="gate", params=True,
           note="CLIP's head: the mean token's query over 1 + 5*7 tokens"),
      case("attn_latent_tokens", call(AttentionPoolLatent, 8, num_heads=2, mlp_ratio=1.0),
           input="gate_map_unbatched", tolerance="gate", params=True,
           note="(5, 7, 8) read as 5 sequences of 7 tokens (N, L, C); an 8-wide MLP"),
  ]


def _generalized_cases() -> list[Case]:
  # p and r are nnx.Params set from the arguments (no rngs); their gradients are recorded.
  return [
      case("gem_p3_positive", call(GeMPool, 3.0), input="positive", tolerance="global",
           params=True, rngs=False),
      case("lse_plus_r10_batch", call(LsePlusPool, 10.0), input="batch", tolerance="global",
           params=True, rngs=False),
  ]


def _blur_median_cases() -> list[Case]:
  return [
      case("blur_f3s2_one", call(BlurPool, 3, 2), input="one",
           note="binomial [1, 2, 1] filter, reflect padding, stride 2"),
      case("median_k3_same_one", call(MedianPool, 3, 1, same=True), input="one",
           tolerance="select", note="distinct values: the median is one input cell"),
  ]


# FractionalMaxPool's samples (PyTorch's _random_samples) are fixed per example; a batch of
# k copies of the input (check --devices k) takes k copies of them.
_FRACTIONAL_SALT = 29


def _fractional_with_samples(window: tuple[int, int], output_size: tuple[int, int],
                             per_example: tuple[int, int]) -> Callable[[Any], Any]:
  pool = FractionalMaxPool(window, output_size, return_indices=True)
  samples = uniform((*per_example, 2), _FRACTIONAL_SALT)

  def pool_with_fixed_samples(x):
    return pool(x, samples=jax.numpy.tile(samples, (x.shape[0] // per_example[0], 1, 1)))

  return pool_with_fixed_samples


def _fractional_cases() -> list[Case]:
  window, size, per_example = (3, 3), (3, 4), (2, 3)
  return [
      Case("fractional_max_k3_out34_indices_asym",
           functools.partial(_fractional_with_samples, window, size, per_example),
           input="asym", module="FractionalMaxPool", tolerance="select", indices=True,
           config=(f"FractionalMaxPool({window}, {size}, return_indices=True)(x, samples="
                   f"uniform({(*per_example, 2)}, {_FRACTIONAL_SALT}))"),
           note="windows of 3 overlap on 5x7: the gradient accumulates where they do"),
  ]


BUILDERS: tuple[Callable[[], list[Case]], ...] = (
    _max_cases, _min_cases, _avg_cases, _lp_cases, _global_cases, _adaptive_cases,
    _select_adaptive_cases, _unpool_cases, _gate_cases, _attention_cases, _generalized_cases,
    _blur_median_cases, _fractional_cases,
)


def build_cases(builders: Sequence[Callable[[], list[Case]]] = BUILDERS) -> Batch:
  """Runs every builder and checks the batch covers every public module.

  Args:
    builders: the case builders (default :data:`BUILDERS`).

  Returns:
    A :class:`Batch`; its notes name public modules that no case covers.

  Raises:
    ValueError: two cases share a name.
  """
  cases = [c for builder in builders for c in builder()]
  seen: set[str] = set()
  for c in cases:
    if c.name in seen:
      raise ValueError(f"case name {c.name!r} is used twice; case names must be unique.")
    seen.add(c.name)
  covered = {c.module for c in cases}
  uncovered = sorted(set(public_modules()) - covered)
  notes = [f"public modules with no regression cases: {', '.join(uncovered)}"] if uncovered else []
  return Batch(cases=cases, notes=notes)


def public_modules() -> list[str]:
  """The ``nnx.Module`` classes ``nnx_pool`` exports."""
  return [
      n for n in nnx_pool.__all__
      if isinstance(getattr(nnx_pool, n), type) and issubclass(getattr(nnx_pool, n), nnx.Module)
  ]


def load_batch() -> Batch:
  """The canonical batch over ``nnx_pool``.

  An import or build failure propagates (the CLI prints its traceback and exits 2).
  """
  return build_cases()
