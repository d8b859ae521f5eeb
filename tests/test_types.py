"""The public API's annotations where users meet them: pyright on a user's own files.

``make typecheck`` runs these (``-m typecheck``; the default suite skips them). They need the
``typecheck`` extra (pyright, with the Node.js it runs on, as wheels). The files lie in a
folder outside the repository and pyright finds nnx_pool as an editor does: through this
venv's interpreter, with no path of ours (the links ``tools/link_layout.py`` lays out, which
``make`` runs; the editable install's import hook alone is invisible to pyright), in its
default ``standard`` mode, the one a user who runs ``pyright`` gets.

* ``user_ok.py`` uses the public API correctly, states the types it expects with
  ``typing.assert_type`` (the ``(values, indices)`` tuple of ``return_indices=True`` among
  them), feeds every pooling module to a convolution as a model does,
  ``self.conv(self.pool(x))``, and must check without a diagnostic. It also runs, so every
  call in it is a real one.
* ``user_misuse.py`` holds one mistake a line, each marked with the pyright rule that must
  report it there: a missing or wrong annotation lets one through, and the test names it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.typecheck,
    pytest.mark.skipif("'typecheck' not in (config.getoption('markexpr') or '')",
                       reason="runs pyright on a user's files: `make typecheck` (-m typecheck)"),
]

ROOT = Path(__file__).resolve().parents[1]
PYRIGHT = Path(sys.executable).with_name("pyright")

USER_OK = '''
"""A user's model and checks, written against nnx-pool's public API."""

import sys
from pathlib import Path
from typing import assert_type

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_pool import (
  AdaptiveAvgPool,
  AdaptiveMaxPool,
  AttentionPool,
  AttentionPoolLatent,
  AvgPool,
  BlurPool,
  FractionalMaxPool,
  GeMPool,
  GlobalAvgPool,
  GlobalMaxPool,
  LPPool,
  LsePlusPool,
  MaxPool,
  MaxUnpool,
  MedianPool,
  MinPool,
  SelectAdaptivePool,
  SqueezeExcitation,
  output_shape,
)
from nnx_pool import functional as F
from nnx_pool.regression.guard import Guard, Outcome
from nnx_pool.regression.pytest_plugin import Regression


class Stem(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)
    self.se = SqueezeExcitation(8, rngs=rngs)
    self.head = GeMPool(in_features=8)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = F.max_pool(self.conv(x), 3, 2, 1)  # the functional twin returns one array
    return self.head(self.se(y))


class EveryPool(nnx.Module):
  """Each pooling module's output straight into a convolution, as a model feeds them."""

  def __init__(self, rngs: nnx.Rngs):
    self.conv = nnx.Conv(3, 4, (1, 1), rngs=rngs)
    self.dense = nnx.Linear(3, 4, rngs=rngs)
    self.avg = AvgPool(2)
    self.max = MaxPool(3, 2, 1)
    self.min = MinPool(2, return_indices=False)
    self.lp = LPPool(2, 2)
    self.indexed = MaxPool(2, return_indices=True)
    self.unpool = MaxUnpool(2)
    self.adaptive_avg = AdaptiveAvgPool(4)
    self.adaptive_max = AdaptiveMaxPool(4)
    self.global_avg = GlobalAvgPool(keepdims=True)
    self.global_max = GlobalMaxPool(keepdims=True)
    self.select = SelectAdaptivePool(2, pool_type="avgmax")
    self.fractional = FractionalMaxPool(2, output_ratio=0.5)
    self.blur = BlurPool(3, 2)
    self.median = MedianPool(3, padding=1)
    self.gem = GeMPool(flatten=False)
    self.lse = LsePlusPool(flatten=False)
    self.attention = AttentionPool(3, feat_size=8, out_features=3, num_heads=1, pool_type="",
                                   rngs=rngs)
    self.latent = AttentionPoolLatent(3, num_heads=1, pool_type="", rngs=rngs)

  def __call__(self, x: jax.Array) -> list[jax.Array]:
    return [
        self.conv(self.avg(x)), self.conv(self.max(x)), self.conv(self.min(x)),
        self.conv(self.lp(x)), self.conv(self.unpool(*self.indexed(x), output_size=(8, 8))),
        self.conv(self.adaptive_avg(x)), self.conv(self.adaptive_max(x)),
        self.conv(self.global_avg(x)), self.conv(self.global_max(x)),
        self.conv(self.select(x)), self.conv(self.fractional(x, rngs=nnx.Rngs(dropout=0))),
        self.conv(self.blur(x)), self.conv(self.median(x)), self.conv(self.gem(x)),
        self.conv(self.lse(x)), self.conv(self.attention(x)),
        self.dense(self.latent(x.reshape(2, 64, 3))),
    ]


x = jnp.ones((2, 8, 8, 3))
assert_type(Stem(nnx.Rngs(0))(x), jax.Array)
assert len(EveryPool(nnx.Rngs(0))(x)) == 17

# The window arguments: ints, NumPy ints, tuples of them; padding in every form.
assert_type(AvgPool(2)(x), jax.Array)
assert_type(AvgPool((2, 2), np.int64(1), ((1, 0), (0, 1)), count_include_pad=False)(x),
            jax.Array)
assert_type(F.avg_pool(x, 2, 2, "SAME"), jax.Array)
assert_type(F.lp_pool(x, 2.0, (2, 2)), jax.Array)
assert_type(output_shape((8, 112, 112, 64), 3, 2, 1), tuple[int, ...])

# return_indices: the functions' result type follows a literal True or False.
assert_type(F.max_pool(x, 3, 2, 1), jax.Array)
values, indices = F.max_pool(x, 2, 2, return_indices=True)
assert_type(values, jax.Array)
assert_type(indices, jax.Array)
assert_type(F.min_pool(x, 2, 2, return_indices=True), tuple[jax.Array, jax.Array])
flag = bool(sys.argv[0])
assert_type(F.max_pool(x, 2, 2, return_indices=flag), jax.Array | tuple[jax.Array, jax.Array])
assert_type(F.adaptive_max_pool(x, 3, return_indices=True), tuple[jax.Array, jax.Array])
assert_type(F.max_unpool(values, indices, 2, output_size=(8, 8)), jax.Array)
key = jax.random.key(0)
assert_type(F.fractional_max_pool(x, 2, 3, key=key, return_indices=True),
            tuple[jax.Array, jax.Array])

# A module is generic in what a call returns, picked by a literal return_indices in its
# constructor; a bool variable gives the union, and a bare annotation means jax.Array.
assert_type(MaxPool(2), MaxPool[jax.Array])
assert_type(MinPool(2, return_indices=True), MinPool[tuple[jax.Array, jax.Array]])
assert_type(MaxPool(2, dilation=1, return_indices=flag),
            MaxPool[jax.Array | tuple[jax.Array, jax.Array]])
pooled = MaxPool(2, return_indices=True)(x)
assert_type(pooled, tuple[jax.Array, jax.Array])
values, indices = pooled
assert_type(MaxUnpool(2)(values, indices, output_size=(8, 8)), jax.Array)
assert_type(AdaptiveMaxPool((3, None))(x), jax.Array)
assert_type(AdaptiveMaxPool(3, return_indices=True)(x), tuple[jax.Array, jax.Array])
assert_type(FractionalMaxPool(2, output_ratio=0.5)(x, rngs=nnx.Rngs(dropout=0)), jax.Array)
assert_type(FractionalMaxPool(2, 3, return_indices=True)(x, rngs=nnx.Rngs(dropout=0)),
            tuple[jax.Array, jax.Array])
assert_type(MinPool(2, return_indices=flag)(x), jax.Array | tuple[jax.Array, jax.Array])


def pool_with(pool: MaxPool, y: jax.Array) -> jax.Array:
  return pool(y)  # a bare MaxPool is a MaxPool[jax.Array]


def pool_indexed(pool: AdaptiveMaxPool[tuple[jax.Array, jax.Array]], y: jax.Array) -> jax.Array:
  return pool(y)[1]


assert_type(pool_with(MaxPool(2), x), jax.Array)
assert_type(pool_indexed(AdaptiveMaxPool(2, return_indices=True), x), jax.Array)

assert_type(AdaptiveAvgPool((7, None))(x), jax.Array)
assert_type(GlobalAvgPool(keepdims=True)(x), jax.Array)
assert_type(SelectAdaptivePool(1, pool_type="catavgmax", flatten=True)(x), jax.Array)
assert_type(BlurPool(3, 2)(x), jax.Array)
assert_type(MedianPool(3, padding=1)(x), jax.Array)
assert_type(F.gem_pool(x, 3.0), jax.Array)
assert_type(GlobalMaxPool()(x, jnp.ones((2, 8, 8), bool)), jax.Array)
assert_type(F.global_avg_pool(x, jnp.ones((2, 8, 8), bool)), jax.Array)

# timm's head idioms: the features before the projection, and a new projection.
head = AttentionPool(3, feat_size=8, num_heads=1, rngs=nnx.Rngs(0))
assert_type(head(x, pre_logits=True), jax.Array)
head.reset(10, rngs=nnx.Rngs(1))
head.reset(0, pool_type="")
assert_type(MaxUnpool(2, gradient="gather")(values, indices, output_size=(8, 8)), jax.Array)


# The regression kit: a guard in a script, and the pytest fixture's object.
def guard_pool(directory: Path) -> Outcome:
  return Guard(directory, update=True).check("avg_pool_2x2", AvgPool(2), x)


def test_pool(nnx_regression: Regression) -> None:
  nnx_regression.check("max_pool", MaxPool(3, 2, 1), x)


if len(sys.argv) > 1:
  assert guard_pool(Path(sys.argv[1])).status == "written"
'''

# Each line ends with the pyright rule that must report it on that line.
USER_MISUSE = '''
"""Mistakes a user can make with nnx-pool, each one caught by its annotations."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_pool import (
  AdaptiveAvgPool,
  AdaptiveMaxPool,
  AttentionPool,
  AvgPool,
  FractionalMaxPool,
  MaxPool,
  MinPool,
  SqueezeExcitation,
  output_shape,
)
from nnx_pool import functional as F
from nnx_pool.regression.guard import Guard

x = jnp.ones((2, 8, 8, 3))
pool = MaxPool(3, 2, 1)
conv = nnx.Conv(3, 4, (1, 1), rngs=nnx.Rngs(0))

MaxPool("3")  # expect: reportArgumentType
MaxPool(3, padding=1.5)  # expect: reportArgumentType
MaxPool(3, stride=2)  # expect: reportCallIssue
pool()  # expect: reportCallIssue
pool(x, x)  # expect: reportCallIssue
count: int = AvgPool(2)(x)  # expect: reportAssignmentType
F.avg_pool(x, (2, 2), None)  # expect: reportArgumentType
F.avg_pool(x, (2, 2))  # expect: reportCallIssue
F.max_pool(x, 3)  # expect: reportCallIssue
F.min_pool(x, 3, padding=1)  # expect: reportCallIssue
F.max_pool(x, (2, "2"), 2)  # expect: reportArgumentType
F.max_pool(x, 2, 2, return_indices=True).shape  # expect: reportAttributeAccessIssue
values, indices, extra = F.max_pool(x, 2, 2, return_indices=True)  # expect: reportAssignmentType
F.max_unpool(x, 2, 2)  # expect: reportArgumentType
F.max_unpool(x, x.astype(jnp.int32), 2, gradient="torch")  # expect: reportArgumentType
F.gem_pool(x, p="3")  # expect: reportArgumentType
AdaptiveAvgPool("7")  # expect: reportArgumentType
SqueezeExcitation(8)  # expect: reportCallIssue
AttentionPool(3, num_heads=1, rngs=nnx.Rngs(0)).reset(10)  # expect: reportArgumentType
output_shape((1, 8, 8, 3), 2.0)  # expect: reportArgumentType
Guard(3)  # expect: reportArgumentType
Guard(".").check(0, pool, x)  # expect: reportArgumentType
conv(MaxPool(2, return_indices=True)(x))  # expect: reportArgumentType
conv(MinPool(2, return_indices=True)(x))  # expect: reportArgumentType
conv(AdaptiveMaxPool(2, return_indices=True)(x))  # expect: reportArgumentType
conv(FractionalMaxPool(2, 3, return_indices=True)(x, samples=x))  # expect: reportArgumentType
indexed: MaxPool = MaxPool(2, return_indices=True)  # expect: reportAssignmentType
F.min_pool(x, 2, 2, return_indices=True).shape  # expect: reportAttributeAccessIssue


def pooled(y: jax.Array) -> int:
  return F.avg_pool(y, 2, 2)  # expect: reportReturnType


def layer(rngs: nnx.Rngs) -> nnx.Module:
  return SqueezeExcitation(8, rd_ratio="1/16", rngs=rngs)  # expect: reportArgumentType
'''

EXPECT = re.compile(r"# expect: (\w+)$")


def _expected(source: str) -> set[tuple[int, str]]:
  """``(line, rule)`` for each line marked ``# expect: rule`` (1-based lines, as editors)."""
  return {(number, match.group(1)) for number, line in enumerate(source.splitlines(), 1)
          if (match := EXPECT.search(line))}


@pytest.fixture(scope="module")
def diagnostics(tmp_path_factory) -> dict[str, list[tuple[int, str, str, str]]]:
  """pyright's diagnostics for each user file: ``(line, severity, rule, message)``."""
  if not PYRIGHT.exists():
    pytest.fail(f"pyright is not installed beside {sys.executable}: pip install -e '.[typecheck]'"
                " (make typecheck does).")
  project = tmp_path_factory.mktemp("user")  # outside the repository, as a user's project
  assert ROOT not in project.parents
  (project / "user_ok.py").write_text(USER_OK)
  (project / "user_misuse.py").write_text(USER_MISUSE)
  (project / "pyrightconfig.json").write_text(json.dumps({
      "include": ["user_ok.py", "user_misuse.py"], "typeCheckingMode": "standard",
      "pythonVersion": "3.11"}))
  done = subprocess.run([str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable],
                        cwd=project, capture_output=True, text=True, timeout=120, check=False)
  try:
    report = json.loads(done.stdout)
  except json.JSONDecodeError:
    pytest.fail(f"pyright gave no JSON report (exit {done.returncode}): {done.stderr}")
  found: dict[str, list[tuple[int, str, str, str]]] = {"user_ok.py": [], "user_misuse.py": []}
  for d in report["generalDiagnostics"]:
    found[Path(d["file"]).name].append((d["range"]["start"]["line"] + 1, d["severity"],
                                        d.get("rule", ""), d["message"]))
  unresolved = [message for diagnostics in found.values()
                for _, _, rule, message in diagnostics if rule == "reportMissingImports"]
  if unresolved:
    pytest.fail(f"pyright, run with {sys.executable}, resolves no nnx_pool: {unresolved}. The "
                "editable install's import hook is invisible to it; `make` lays out the links "
                "it reads (tools/link_layout.py).")
  return found


def test_correct_use_of_the_public_api_checks_clean(diagnostics):
  lines = USER_OK.splitlines()
  found = [f"line {n} ({severity}, {rule}): {lines[n - 1].strip()}\n  {message}"
           for n, severity, rule, message in diagnostics["user_ok.py"]]
  assert not found, "correct code that pyright refuses:\n" + "\n".join(found)


def test_each_misuse_is_reported_on_its_line(diagnostics):
  expected = _expected(USER_MISUSE)
  assert len(expected) == USER_MISUSE.count("# expect:")  # one mistake a line
  errors = {(line, rule) for line, severity, rule, _ in diagnostics["user_misuse.py"]
            if severity == "error"}
  lines = USER_MISUSE.splitlines()
  missed = [f"line {n}: {lines[n - 1].strip()}" for n, rule in sorted(expected - errors)]
  assert not missed, "a misuse that no annotation catches:\n" + "\n".join(missed)
  unexpected = [f"line {n} ({severity}, {rule}): {message}"
                for n, severity, rule, message in diagnostics["user_misuse.py"]
                if (n, rule) not in expected]
  assert not unexpected, "\n".join(unexpected)


def test_the_links_lay_out_the_package_as_installed(tmp_path):
  # tools/link_layout.py into a stand-in environment: every module of nnx_pool/ linked, the
  # regression/ folder as nnx_pool/regression, and a .pth naming the folder; its other line
  # imports the path hook written beside it, which Python runs and type checkers skip
  # (tests/test_editable.py checks what it does).
  sys.path.insert(0, str(ROOT / "tools"))
  try:
    from link_layout import link_layout
  finally:
    sys.path.remove(str(ROOT / "tools"))
  (tmp_path / "site-packages").mkdir()
  tree = link_layout(tmp_path, tmp_path / "site-packages")
  package = tree / "nnx_pool"
  first, *rest = (tmp_path / "site-packages" / "nnx-pool-links.pth").read_text().splitlines()
  assert first == str(tree) and rest == ["import _nnx_pool_links"]
  assert (tmp_path / "site-packages" / "_nnx_pool_links.py").is_file()
  assert sorted(p.name for p in package.iterdir() if p.suffix in (".py", ".pyi")) == sorted(
      p.name for p in (ROOT / "nnx_pool").iterdir() if p.suffix in (".py", ".pyi"))
  assert all(p.is_symlink() for p in package.iterdir())
  assert (package / "_pool.py").resolve() == ROOT / "nnx_pool" / "_pool.py"
  assert (package / "regression").resolve() == ROOT / "regression"
  assert (package / "regression" / "guard.py").is_file()
  link_layout(tmp_path, tmp_path / "site-packages")  # again: replaced, not nested
  assert not (package / "nnx_pool").exists() and (package / "py.typed").is_symlink()


def test_the_correct_file_runs(tmp_path):
  """Every call in user_ok.py is one nnx-pool accepts: run it (the guard records a baseline)."""
  script = tmp_path / "user_ok.py"
  script.write_text(USER_OK)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, str(script), str(tmp_path / "baselines")],
                        capture_output=True, text=True, timeout=120, check=False, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
