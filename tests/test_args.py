"""Tests for nnx_pool._args: the peers' argument names, answered with ours.

A porter types PyTorch's names first (``stride``, ``kernel_size``) and timm's or
torchvision's for the gates (``channels``, ``act_layer``). Each gets a TypeError
that names the public class or function and the argument to use, never a private
base class (before: "_SelectPool.__init__() got an unexpected keyword argument
'stride'").
"""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import pytest
from flax import nnx

from nnx_pool import (
  CBAM,
  AdaptiveAvgPool,
  AdaptiveMaxPool,
  AvgPool,
  BlurPool,
  EffectiveSqueezeExcitation,
  EfficientChannelAttention,
  FractionalMaxPool,
  GlobalAvgPool,
  GlobalMaxPool,
  LPPool,
  MaxPool,
  MaxUnpool,
  MedianPool,
  MinPool,
  SelectAdaptivePool,
  SqueezeExcitation,
)
from nnx_pool import functional as F
from nnx_pool._args import PEER_NAMES

X = jnp.ones((1, 4, 4, 1))
RNGS = nnx.Rngs(0)

# (what the user wrote, the public name in the message, our argument, the peer's name, whose)
CASES = [
    (lambda: MaxPool(2, stride=2), "MaxPool", "strides", "stride", "PyTorch's"),
    (lambda: MaxPool(kernel_size=2), "MaxPool", "window_shape", "kernel_size", "PyTorch's"),
    (lambda: MinPool(2, stride=1), "MinPool", "strides", "stride", "PyTorch's"),
    (lambda: AvgPool(kernel_size=3, stride=2), "AvgPool", "window_shape", "kernel_size",
     "PyTorch's"),
    (lambda: LPPool(2, 3, stride=2), "LPPool", "strides", "stride", "PyTorch's"),
    (lambda: MaxUnpool(kernel_size=2), "MaxUnpool", "window_shape", "kernel_size", "PyTorch's"),
    (lambda: GlobalAvgPool(keepdim=True), "GlobalAvgPool", "keepdims", "keepdim", "PyTorch's"),
    (lambda: GlobalMaxPool(keepdim=True), "GlobalMaxPool", "keepdims", "keepdim", "PyTorch's"),
    (lambda: AdaptiveAvgPool(1, channels=3), "AdaptiveAvgPool", "in_features", "channels",
     "timm's"),
    (lambda: AdaptiveMaxPool(1, channels=3), "AdaptiveMaxPool", "in_features", "channels",
     "timm's"),
    (lambda: SelectAdaptivePool(1, channels=3), "SelectAdaptivePool", "in_features", "channels",
     "timm's"),
    (lambda: F.max_pool(X, 2, stride=2), "max_pool", "strides", "stride", "PyTorch's"),
    (lambda: F.min_pool(X, kernel_size=2), "min_pool", "window_shape", "kernel_size",
     "PyTorch's"),
    (lambda: F.avg_pool(X, 2, stride=2), "avg_pool", "strides", "stride", "PyTorch's"),
    (lambda: F.lp_pool(X, 2, kernel_size=2), "lp_pool", "window_shape", "kernel_size",
     "PyTorch's"),
    (lambda: F.max_unpool(X, X.astype(jnp.int32), 2, stride=2), "max_unpool", "strides",
     "stride", "PyTorch's"),
    (lambda: F.global_avg_pool(X, keepdim=True), "global_avg_pool", "keepdims", "keepdim",
     "PyTorch's"),
    (lambda: F.global_max_pool(X, keepdim=True), "global_max_pool", "keepdims", "keepdim",
     "PyTorch's"),
    (lambda: F.adaptive_avg_pool(X, 1, channels=1), "adaptive_avg_pool", "in_features",
     "channels", "timm's"),
    (lambda: F.adaptive_max_pool(X, 1, channels=1), "adaptive_max_pool", "in_features",
     "channels", "timm's"),
    (lambda: SqueezeExcitation(channels=8, rngs=RNGS), "SqueezeExcitation", "in_features",
     "channels", "timm's"),
    (lambda: SqueezeExcitation(input_channels=8, rngs=RNGS), "SqueezeExcitation",
     "in_features", "input_channels", "torchvision's"),
    (lambda: SqueezeExcitation(8, squeeze_channels=2, rngs=RNGS), "SqueezeExcitation",
     "squeeze_features", "squeeze_channels", "torchvision's"),
    (lambda: SqueezeExcitation(8, rd_channels=2, rngs=RNGS), "SqueezeExcitation",
     "squeeze_features", "rd_channels", "timm's"),
    (lambda: SqueezeExcitation(8, act_layer=nnx.relu, rngs=RNGS), "SqueezeExcitation",
     "activation", "act_layer", "timm's"),
    (lambda: SqueezeExcitation(8, scale_activation=nnx.sigmoid, rngs=RNGS), "SqueezeExcitation",
     "gate", "scale_activation", "torchvision's"),
    (lambda: SqueezeExcitation(8, bias=False, rngs=RNGS), "SqueezeExcitation", "use_bias",
     "bias", "timm's"),
    (lambda: EffectiveSqueezeExcitation(8, gate_layer=nnx.sigmoid, rngs=RNGS),
     "EffectiveSqueezeExcitation", "gate", "gate_layer", "timm's"),
    (lambda: EfficientChannelAttention(channels=8, rngs=RNGS), "EfficientChannelAttention",
     "in_features", "channels", "timm's"),
    (lambda: CBAM(8, mlp_bias=True, rngs=RNGS), "CBAM", "use_bias", "mlp_bias", "timm's"),
    (lambda: CBAM(8, act_layer=nnx.relu, rngs=RNGS), "CBAM", "activation", "act_layer",
     "timm's"),
    # timm 1.0.31 BlurPool2d(channels, filt_size, stride, pad_mode) and MedianPool2d(kernel_size,
    # stride, padding, same); PyTorch 2.13 FractionalMaxPool2d(kernel_size, output_size,
    # output_ratio, return_indices, _random_samples) and F.fractional_max_pool2d likewise.
    (lambda: BlurPool(filt_size=5), "BlurPool", "filter_size", "filt_size", "timm's"),
    (lambda: BlurPool(3, stride=2), "BlurPool", "strides", "stride", "PyTorch's"),
    (lambda: BlurPool(channels=8), "BlurPool", "in_features", "channels", "timm's"),
    (lambda: F.blur_pool(X, filt_size=3), "blur_pool", "filter_size", "filt_size", "timm's"),
    (lambda: MedianPool(kernel_size=3), "MedianPool", "window_shape", "kernel_size",
     "PyTorch's"),
    (lambda: MedianPool(3, stride=1), "MedianPool", "strides", "stride", "PyTorch's"),
    (lambda: F.median_pool(X, kernel_size=3), "median_pool", "window_shape", "kernel_size",
     "PyTorch's"),
    (lambda: FractionalMaxPool(kernel_size=2, output_size=3), "FractionalMaxPool",
     "window_shape", "kernel_size", "PyTorch's"),
    (lambda: F.fractional_max_pool(X, 2, 2, _random_samples=jnp.zeros((1, 1, 2))),
     "fractional_max_pool", "samples", "_random_samples", "PyTorch's"),
]


@pytest.mark.parametrize("call, owner, ours, theirs, whose", CASES,
                         ids=[f"{c[1]}-{c[3]}" for c in CASES])
def test_a_peers_name_is_answered_with_ours(call, owner, ours, theirs, whose):
  with pytest.raises(TypeError) as info:
    call()
  assert str(info.value) == (
      f"{owner} takes `{ours}` ({PEER_NAMES[theirs][1]} name), not `{theirs}` ({whose}): "
      f"write {ours}=... instead.")


def test_a_peers_constructor_argument_taken_per_call_is_answered_with_the_call():
  # PyTorch's FractionalMaxPool2d(2, output_size=3, _random_samples=s) keeps its samples; ours
  # takes them in each call (its __call__'s keyword-only `samples`).
  with pytest.raises(TypeError) as info:
    FractionalMaxPool(2, 3, _random_samples=jnp.zeros((1, 1, 2)))
  assert str(info.value) == (
      "FractionalMaxPool takes `samples` (nnx-pool's name) when called, not `_random_samples` "
      "(PyTorch's) when built: write FractionalMaxPool(...)(inputs, samples=...) instead.")


def test_the_issues_example_message():
  # Written out: what a porter typing PyTorch's MaxPool2d(2, stride=2) reads.
  with pytest.raises(TypeError, match=r"^MaxPool takes `strides` \(Flax's name\), not "
                                      r"`stride` \(PyTorch's\): write strides=\.\.\. instead\.$"):
    MaxPool(2, stride=2)


def test_an_unknown_keyword_names_the_public_class_and_what_it_takes():
  with pytest.raises(TypeError, match=r"^MinPool got an unexpected keyword argument `pad`; "
                                      r"MinPool takes \(window_shape, strides, padding, \*, "
                                      r"num_spatial_dims, dilation, ceil_mode, return_indices, "
                                      r"in_features\)\.$"):
    MinPool(2, pad=1)


def test_too_many_positional_arguments_name_the_public_class():
  with pytest.raises(TypeError, match=r"^MaxPool got 4 positional arguments, at most 3; "
                                      r"MaxPool takes \(window_shape, strides, padding, \*"):
    MaxPool(2, 2, 0, 1)


def test_a_peer_name_for_an_argument_the_layer_lacks_is_an_unknown_keyword():
  # MaxPool has no `use_bias`: `bias` is not renamed, it is refused as unknown.
  with pytest.raises(TypeError, match=r"^MaxPool got an unexpected keyword argument `bias`"):
    MaxPool(2, bias=True)


def test_correct_calls_pass_through_unchanged():
  # The wrapper keeps the signature that help() and editors show, and the result.
  assert list(inspect.signature(MaxPool.__init__).parameters)[:4] == [
      "self", "window_shape", "strides", "padding"]
  y = MaxPool(window_shape=2, strides=1)(jnp.arange(16.0).reshape(1, 4, 4, 1))
  # Hand computation: each 2x2 window of arange(16) as 4x4 peaks at its bottom-right cell.
  assert y[0, ..., 0].tolist() == [[5, 6, 7], [9, 10, 11], [13, 14, 15]]
