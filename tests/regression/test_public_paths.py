"""Every path of the kit that the README, the guides, the docs and the site name still imports.

The kit's modules moved into rooms (store/, compare/, report/, batch/, fixture/, upgrade/,
cli/); a user's import, the console script, the pytest plugin's entry point and the
site's ``:::`` directives name the paths below, which must keep working whatever moves
behind them. Where each is named: README.md and guides/07 (``python -m`` and ``cli.main``),
guides/10 and docs/regression.md (``guard.Guard``, the store and commands of its HTML
demo, ``batch.load_batch``), guides/13 (``processes.initialize``), pyproject.toml (the
console script and the ``pytest11`` entry point), docs/site_src/hooks.py (the command line's
parser, the plugin's options, the package's ``__all__``), benchmarks/ (``tolerance.scales``,
the CLI's integer type).
"""

from __future__ import annotations

import importlib
import importlib.metadata

# (module, the names it must hold), one entry per public path.
PUBLIC = [
    ("nnx_pool.regression", ["FORMAT_VERSION", "__all__"]),
    ("nnx_pool.regression.__main__", ["main"]),
    ("nnx_pool.regression.cli", ["main", "make_parser", "run"]),
    ("nnx_pool.regression.cli.parser", ["positive_int"]),
    ("nnx_pool.regression.pytest_plugin", ["Regression", "nnx_regression", "pytest_addoption",
                                           "pytest_configure", "pytest_terminal_summary"]),
    ("nnx_pool.regression.guard", ["Guard", "Outcome", "RegressionFailure", "RegressionNote"]),
    ("nnx_pool.regression.commands", ["record", "check", "diff", "info", "load"]),
    ("nnx_pool.regression.store", ["FORMAT_VERSION", "MANIFEST", "Baseline", "BaselineError",
                                   "read_baseline", "write_baseline", "write_atomic", "digest"]),
    ("nnx_pool.regression.batch", ["Batch", "Case", "ErrorSpec", "call", "case", "load_batch",
                                   "select", "BUILDERS"]),
    ("nnx_pool.regression.tolerance", ["KINDS", "Tolerance", "tolerance_for", "scales",
                                       "policy_table"]),
    ("nnx_pool.regression.compare", ["Verdict", "compare_arrays", "failing_elements"]),
    ("nnx_pool.regression.report", ["Report", "Row", "FailedArray", "render", "write_json"]),
    ("nnx_pool.regression.report.html", ["write_html", "render_html", "available"]),
    ("nnx_pool.regression.stamp", ["SHIPPED", "collect_stamp", "stamp_changes"]),
    ("nnx_pool.regression.runner", ["split_callable", "compile_and_time", "compare_results"]),
    ("nnx_pool.regression.processes", ["initialize"]),
]


def test_every_public_path_of_the_kit_imports():
  missing = []
  for module, names in PUBLIC:
    loaded = importlib.import_module(module)
    missing += [f"{module}.{name}" for name in names if not hasattr(loaded, name)]
  assert missing == []
  (script,) = importlib.metadata.entry_points(group="console_scripts", name="nnx-pool-regression")
  (plugin,) = importlib.metadata.entry_points(group="pytest11", name="nnx_regression")
  assert script.value == "nnx_pool.regression.cli:main"
  assert script.load() is importlib.import_module("nnx_pool.regression.cli").main
  assert plugin.value == "nnx_pool.regression.pytest_plugin"
  assert plugin.load() is importlib.import_module("nnx_pool.regression.pytest_plugin")
