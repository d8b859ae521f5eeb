"""Root pytest configuration: strict JAX settings, and Markdown code blocks as tests.

Every ``python`` code block in README.md and guides/*.md runs under pytest through
Sybil. Blocks written as ``>>>`` sessions are doctests, so every result they show is
compared with what the library really returns.
"""

import doctest

import jax
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

# Implicit rank promotion hides layout bugs (an (N, C) array broadcast against an
# (N, H, W, C) one); raise instead, as Equinox's suite does.
jax.config.update("jax_numpy_rank_promotion", "raise")

pytest_collect_file = Sybil(
    parsers=[
        PythonCodeBlockParser(doctest_optionflags=doctest.NORMALIZE_WHITESPACE),
        SkipParser(),
    ],
    patterns=["README.md", "guides/*.md"],
).pytest()


# Balancing the two xdist workers (`make test` runs `-n 2 --dist loadfile`): a worker
# takes the next whole file when it is nearly done with its current one, so the files
# that take longest go first and the many short ones fill in behind them (longest
# processing time first). pytest-xdist would otherwise sort files by their number of
# tests, which put the 8-device sharding run (few tests, a long setup) near the end,
# where it serialised on one worker. Measured serially on 2 cores; the rest of the
# files keep their collection order after these. Within a file nothing moves, so
# Sybil's Markdown blocks stay in order.
SLOW_FILES_FIRST = (
    "tests/test_kernels.py",
    "tests/test_sharding.py",
    "tests/test_robustness.py",
    "tests/test_pool.py",
    "tests/test_regression_shipped.py",
    "tests/test_pool_properties.py",
    "tests/test_backend.py",
    "tests/test_pool_torch.py",
    "tests/test_adaptive.py",
    "tests/test_install.py",
    "tests/test_errors_table.py",
    "tests/test_regression_robustness.py",
    "tests/test_gates.py",
    "tests/test_regression_cli.py",
)


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
  root = config.rootpath
  def file_rank(item):
    path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
    return rank.get(path, len(rank))
  items.sort(key=file_rank)  # stable: the order within a file, and of the other files, stays
