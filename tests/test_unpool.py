"""Tests for MaxUnpool (nnx_pool._unpool): explicit arrays, round trips and PyTorch parity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_pool import MaxPool, MaxUnpool, reference

GRID = np.array(
    [[1, 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]], dtype=np.float32
)


def test_maxunpool_seed003_round_trip():
  # seed 003: maxima 4, 8, 9, -2 return to cells 5, 6, 13, 11; zeros elsewhere.
  values, indices = MaxPool((2, 2), return_indices=True)(GRID[None, :, :, None])
  y = MaxUnpool((2, 2))(values, indices)
  expected = np.zeros(16, np.float32)
  expected[[5, 6, 13, 11]] = [4, 8, 9, -2]
  np.testing.assert_array_equal(y[0, :, :, 0], expected.reshape(4, 4))


def test_maxunpool_default_and_explicit_output_size():
  unpool = MaxUnpool(3, 2, 1, num_spatial_dims=1)
  # PyTorch: (in - 1) * s - 2p + k = (3 - 1) * 2 - 2 + 3 = 5.
  assert unpool.default_output_size((3,)) == (5,)
  x = np.ones((1, 3, 1), np.float32)  # NumPy inputs: jnp ones compile a program each
  idx = np.array([0, 2, 4], np.int32)[None, :, None]
  np.testing.assert_array_equal(unpool(x, idx)[0, :, 0], [1, 0, 1, 0, 1])
  # Within one stride of 5: 4 and 6 are allowed (also as a full NHWC shape); 3 and 7 not.
  # Only the shapes are the point: traced (jax.eval_shape), nothing compiled.
  assert jax.eval_shape(lambda: unpool(x, idx, output_size=(6,))).shape == (1, 6, 1)
  assert jax.eval_shape(lambda: unpool(x, idx % 4, output_size=(1, 4, 1))).shape == (1, 4, 1)
  for bad in ((3,), (7,)):
    with pytest.raises(ValueError, match=r"strictly between 3 and 7 \(default 5, stride 2\)"):
      unpool(x, idx, output_size=bad)


def test_maxunpool_gradient_returns_to_inputs_by_either_rule():
  x = np.array([1.0, 2.0, 3.0], np.float32)[None, :, None]
  idx = np.array([1, 1, 3], np.int32)[None, :, None]  # inputs 0 and 1 both name cell 1
  cotangent = np.array([10.0, 20.0, 30.0, 40.0, 50.0], np.float32)[None, :, None]
  rules = ("written", "gather")
  unpools = [MaxUnpool((2,), gradient=gradient) for gradient in rules]

  @jax.jit  # every call in one program (eager, each op and gradient compiled alone)
  def run(x):
    # Default size (3 - 1) * 2 + 2 = 6; 5 is within one stride.
    return MaxUnpool((2,))(x, idx, output_size=(5,)), [
        (jax.grad(lambda x, u=u: jnp.sum(u(x, idx, output_size=(5,)) * cotangent))(x),
         jax.jvp(lambda x, u=u: u(x, idx, output_size=(5,)), (x,), (x,))[1])
        for u in unpools]

  y, pulled = run(x)
  # The last writer in row-major input order wins the shared cell.
  np.testing.assert_array_equal(y[0, :, 0], [0, 2, 0, 3, 0])
  # By hand: "written", each cell's cotangent to the input written there (input 0 lost
  # cell 1 to input 1, so it gets 0); "gather", PyTorch's, each input the cotangent of the
  # cell it names (inputs 0 and 1 both 20). Forward mode (tangents 1, 2, 3): the tangents
  # of the writers, or (its transpose) the sum of every input naming the cell.
  for gradient, unpool, (grad, out_tangent), want, tangent in zip(
      rules, unpools, pulled, ([0, 20, 40], [20, 20, 40]), ([0, 2, 0, 3, 0], [0, 3, 0, 3, 0]),
      strict=True):
    assert unpool.gradient == gradient
    np.testing.assert_array_equal(grad[0, :, 0], want, err_msg=gradient)
    np.testing.assert_array_equal(out_tangent[0, :, 0], tangent, err_msg=gradient)
  with pytest.raises(ValueError, match=r"`gradient` must be one of 'written' \(each cell's "):
    MaxUnpool(2, gradient="torch")


def test_maxunpool_matches_reference_and_jit():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 7, 6, 3)).astype(np.float32)
  # As NumPy arrays: slicing a jax.Array (values[1]) compiles a program per shape.
  values, indices = jax.device_get(MaxPool((3, 2), (2, 2), (1, 0), return_indices=True)(x))
  unpool = MaxUnpool((3, 2), (2, 2), (1, 0))
  y = np.asarray(unpool(values, indices, output_size=(7, 6)))
  expected = reference.max_unpool(values, indices, (3, 2), (2, 2), (1, 0), output_size=(7, 6))
  np.testing.assert_array_equal(y, expected)
  np.testing.assert_array_equal(jax.jit(lambda v, i: unpool(v, i, (7, 6)))(values, indices), y)
  np.testing.assert_array_equal(unpool(values[1], indices[1], (7, 6)), y[1])


def test_maxunpool_bad_input():
  unpool = MaxUnpool((2, 2), in_features=2)
  x = np.ones((1, 2, 2, 2), np.float32)  # NumPy inputs: jnp ones compile a program each
  with pytest.raises(ValueError, match=r"`indices` must lie in \[0, 16\)"):
    unpool(x, np.full((1, 2, 2, 2), 16, np.int32))
  with pytest.raises(ValueError, match="`indices` must have the shape of `inputs`"):
    unpool(x, np.zeros((1, 2, 2, 1), np.int32))
  with pytest.raises(TypeError, match="`indices` must be integers"):
    unpool(x, np.zeros((1, 2, 2, 2), np.float32))
  with pytest.raises(ValueError, match="NCHW"):
    unpool(np.ones((1, 2, 3, 3), np.float32), np.zeros((1, 2, 3, 3), np.int32))
  with pytest.raises(ValueError, match=r"`padding` must be non-negative; got -1\."):
    MaxUnpool((2,), padding=-1)


# (window, strides, padding, shape): 1-D, 2-D and 3-D, default and explicit strides,
# with and without padding.
# (2-D, 3x3 at stride 2 with padding 1 is test_maxunpool_takes_every_maxpool_padding's "int"
# case against PyTorch.)
TORCH_CASES = [
    (2, None, 0, (2, 9, 3)),
    (3, 2, 1, (1, 10, 2)),
    ((2, 2), None, 0, (2, 6, 8, 3)),
    ((3, 2), (1, 2), (1, 1), (2, 5, 6, 1)),
    ((2, 2, 2), None, 0, (1, 4, 6, 4, 2)),
    ((3, 2, 3), (2, 2, 1), (1, 0, 1), (1, 5, 4, 5, 1)),
]


def _pool_unpool_all(cases, xs):
  """MaxPool then MaxUnpool for every ``(window, strides, padding, ndim)``: one jitted program
  (eager, each case compiled its layout steps one by one)."""
  def run(xs):
    out = []
    for (window, strides, padding, ndim), x in zip(cases, xs, strict=True):
      values, indices = MaxPool(window, strides, padding, num_spatial_dims=ndim,
                                return_indices=True)(x)
      y = MaxUnpool(window, strides, padding, num_spatial_dims=ndim)(
          values, indices, output_size=x.shape[1:-1])
      out.append((values, indices, y))
    return out

  return jax.device_get(jax.jit(run)(xs))


def _to_torch(torch, a):
  return torch.from_numpy(np.moveaxis(np.array(a), -1, 1))


def test_maxunpool_matches_torch():
  torch = pytest.importorskip(
      "torch", reason="PyTorch parity needs torch==2.13.0 (the parity extra)")
  xs = [np.random.default_rng(1).permutation(np.prod(shape)).reshape(shape).astype(np.float32)
        for *_, shape in TORCH_CASES]
  # The pooled values and indices from the NumPy mirror (reference.max_pool, PyTorch's
  # rules), so that the one jitted program is the seven unpoolings: with our MaxPool in it
  # as well it compiled in 1.37 s of CPU, without it 0.83 s (jax.jit(...).lower().compile(),
  # 2 cores). Our MaxPool's indices into our MaxUnpool: the padding test below (2-D),
  # test_maxunpool_matches_reference_and_jit, and tests/test_robustness.py's
  # test_max_unpool_matches_mirror (1-, 2- and 3-D against the mirror).
  pooled = [reference.max_pool(x, _tuple(window, x.ndim - 2), _tuple(strides or window,
                                                                      x.ndim - 2),
                               [(p, p) for p in _tuple(padding, x.ndim - 2)])
            for (window, strides, padding, _), x in zip(TORCH_CASES, xs, strict=True)]

  @jax.jit
  def run(pooled):
    return [MaxUnpool(window, strides, padding, num_spatial_dims=len(shape) - 2)(
        values, indices, output_size=shape[1:-1])
            for (window, strides, padding, shape), (values, indices) in zip(
                TORCH_CASES, pooled, strict=True)]

  for (window, strides, padding, shape), (values, indices), y in zip(
      TORCH_CASES, pooled, run(pooled), strict=True):
    unpool = {1: torch.nn.functional.max_unpool1d, 2: torch.nn.functional.max_unpool2d,
              3: torch.nn.functional.max_unpool3d}[len(shape) - 2]
    expected = unpool(
        _to_torch(torch, values), _to_torch(torch, indices).long(), window, strides, padding,
        output_size=shape[1:-1],
    )
    # PyTorch 2.13 CPU; tie-free inputs, so no two windows name the same cell.
    np.testing.assert_array_equal(y, np.moveaxis(expected.numpy(), 1, -1),
                                  err_msg=str((window, strides, padding, shape)))


def _tuple(v, n):
  return tuple(v) if isinstance(v, tuple) else (v,) * n


# Every padding form MaxPool takes, copied to MaxUnpool, on a (1, 7, 8, 2) map. The
# PyTorch call takes the symmetric padding that gives the same range check, ``pad``,
# and an explicit output_size; PyTorch ignores padding otherwise.
PADDINGS = [
    ("int", 1, 1),
    ("per-dim ints", (1, 0), (1, 0)),
    ("pairs", ((1, 0), (0, 1)), 0),
    ("SAME", "SAME", (1, 0)),  # lax SAME for k=3, s=2: 7 -> (1, 1), 8 -> (0, 1)
    ("VALID", "VALID", 0),
]


def test_maxunpool_takes_every_maxpool_padding_and_matches_torch():
  torch = pytest.importorskip(
      "torch", reason="PyTorch parity needs torch==2.13.0 (the parity extra)")
  shape = (1, 7, 8, 2)
  x = np.random.default_rng(3).permutation(np.prod(shape)).reshape(shape).astype(np.float32)
  results = _pool_unpool_all([(3, 2, padding, 2) for _, padding, _ in PADDINGS],
                             [x] * len(PADDINGS))
  for (name, _, pad), (values, indices, y) in zip(PADDINGS, results, strict=True):
    expected = torch.nn.functional.max_unpool2d(
        _to_torch(torch, values), _to_torch(torch, indices).long(), 3, 2, pad,
        output_size=shape[1:-1])
    np.testing.assert_array_equal(y, np.moveaxis(expected.numpy(), 1, -1),  # PyTorch 2.13 CPU
                                  err_msg=name)


def test_maxunpool_default_size_for_padding_pairs_and_dilation():
  # (in - 1) * s - low - high + d * (k - 1) + 1 per dim, PyTorch's formula for p = low = high.
  unpool = MaxUnpool(3, 2, ((1, 0), (0, 1)), dilation=(1, 2))
  assert unpool.default_output_size((3, 4)) == ((3 - 1) * 2 - 1 + 3, (4 - 1) * 2 - 1 + 5)
  assert MaxUnpool(3, 2, 1).default_output_size((3, 4)) == (5, 7)  # PyTorch: 2*2 - 2 + 3


def test_maxunpool_same_needs_output_size_and_checks_it():
  values = np.ones((1, 4, 4, 1), np.float32)  # NumPy inputs: jnp ones compile
  indices = np.zeros((1, 4, 4, 1), np.int32)
  unpool = MaxUnpool(3, 2, "SAME")
  with pytest.raises(ValueError, match=r'padding="SAME" needs `output_size`'):
    unpool(values, indices)
  # The shape only: traced (jax.eval_shape), nothing compiled.
  assert jax.eval_shape(lambda: unpool(values, indices, output_size=(7, 8))).shape == (1, 7, 8, 1)
  with pytest.raises(ValueError, match=r"it pools to \(5, 5\), not to the input's spatial "
                                       r"shape \(4, 4\)"):
    unpool(values, indices, output_size=(9, 9))


# Overlapping windows (stride below the window) make several pooled values name one cell:
# a 2-D 3x3 stride-1 pool and a 1-D window-3 stride-2 padded one, on tie-free maps.
OVERLAPPING = [((3, 3), 1, 0, (2, 7, 7, 3)), (3, 2, 1, (2, 11, 2))]


def test_maxunpool_gather_gradient_matches_torch_where_windows_overlap():
  torch = pytest.importorskip(
      "torch", reason="PyTorch parity needs torch==2.13.0 (the parity extra)")
  rng = np.random.default_rng(5)
  xs = [rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32)
        for *_, shape in OVERLAPPING]

  def pulled_back(unpool, values, indices, size, ct):
    return jax.vjp(lambda v: unpool(v, indices, output_size=size), values)[1](ct)[0]

  def run(xs, cotangents):
    out = []
    for (window, strides, padding, shape), x, ct in zip(OVERLAPPING, xs, cotangents,
                                                        strict=True):
      ndim = len(shape) - 2
      values, indices = MaxPool(window, strides, padding, num_spatial_dims=ndim,
                                return_indices=True)(x)
      grads = [pulled_back(MaxUnpool(window, strides, padding, num_spatial_dims=ndim,
                                     gradient=g), values, indices, shape[1:-1], ct)
               for g in ("written", "gather")]
      out.append((values, indices, *grads))
    return out

  cotangents = [rng.uniform(-1, 1, x.shape).astype(np.float32) for x in xs]
  results = jax.device_get(jax.jit(run)(xs, cotangents))
  for (window, strides, padding, shape), ct, (values, indices, written, gathered) in zip(
      OVERLAPPING, cotangents, results, strict=True):
    unpool = {1: torch.nn.functional.max_unpool1d, 2: torch.nn.functional.max_unpool2d}[
        len(shape) - 2]
    values_t = _to_torch(torch, values).requires_grad_(True)
    y = unpool(values_t, _to_torch(torch, indices).long(), window, strides, padding,
               output_size=shape[1:-1])
    (y * _to_torch(torch, ct)).sum().backward()
    theirs = np.moveaxis(values_t.grad.numpy(), 1, -1)  # PyTorch 2.13 CPU
    np.testing.assert_array_equal(gathered, theirs, err_msg=str(shape))
    # The written rule differs exactly where a value's cell was written by another:
    # PyTorch's gradient there is the cell's cotangent, ours 0.
    lost = written != theirs
    assert lost.any() and (written[lost] == 0).all(), str(shape)
    np.testing.assert_array_equal(written[~lost], theirs[~lost])
    if len(shape) == 4:  # docs/limits.md: 96 of the 150 pooled values
      assert (int(lost.sum()), lost.size) == (96, 150)
