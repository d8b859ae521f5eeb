"""mkdocs hooks: the site's pages, made from the repository's own files and code.

Nothing here copies text by hand. At each build:

* the Markdown the repository already has (README.md as the home page, guides/ with their
  figures, docs/ with its pictures and evidence, CHANGELOG.md) joins the site under its own
  path, so every relative link between those files works on the site as it does on disk;
* the API reference has one page per area. An area is a set of the private modules that
  ``nnx_pool._WHERE`` (the one list of public names) maps names to, so a name added there
  appears on its area's page without editing anything here; a private module that no area
  lists lands on a catch-all page, named in the build log, and never vanishes;
* the regression kit's command line is written from its argparse parser, the fixture's
  options from the plugin's ``pytest_addoption``, and its Python API from
  ``nnx_pool.regression.__all__``;
* the benchmark page gets a chart of its ratios, drawn from docs/benchmarks.json;
* in every rendered page, a public name in code (``MaxPool``, ``F.max_pool`` is not one)
  links to its reference entry, and Sphinx roles (``:class:``) left in docstrings go.
"""

from __future__ import annotations

import argparse
import html
import importlib
import io
import json
import logging
import os
import posixpath
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from installed_layout import lay_out  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Where griffe reads nnx_pool's sources, laid out as installed (mkdocs.yml names it too).
PACKAGE_COPY = ROOT / "build" / "site-pkg"
log = logging.getLogger("mkdocs.hooks.nnx_pool")

# The API reference's areas, in the order of the navigation: (page, title, the private
# modules of nnx_pool._WHERE whose names it shows, what the page covers).
AREAS = (
    ("window-pools", "Window pools", ("_pool",),
     "Average, max, min and LP pooling over 1, 2 or 3 spatial dims."),
    ("global-adaptive", "Global, adaptive and selectable pools", ("_global", "_adaptive"),
     "Pooling to a fixed output size, whatever the input's."),
    ("unpooling", "Unpooling", ("_unpool",),
     "The inverse scatter of a max pool's indices."),
    ("attention-generalized", "Attention and generalized pools",
     ("_attention_pool", "_latent_pool", "_generalized", "_blur", "_median", "_fractional"),
     "Pools with parameters or a rule other than a window's mean or extremum."),
    ("gates", "Gates", ("_gates", "_squeeze_excite", "_eca", "_cbam", "_context_gates"),
     "Channel and spatial gates, each loading PyTorch weights with `from_torch`."),
    ("functional", "nnx_pool.functional", (),
     "One function per pooling module, for use inside an NNX module's `__call__`."),
    ("geometry", "output_shape and the geometry", ("_geometry", "_layout"),
     "The one rule for output sizes, padding and bins, and the layout checks."),
    ("reference", "nnx_pool.reference (the NumPy mirror)", (),
     "A plain-NumPy, loop-per-cell mirror of PyTorch's pooling semantics."),
    ("backends", "Backends", ("_backend",),
     "Which formulation the window kernels use, per JAX backend."),
)
CATCH_ALL = ("more", "More public names",
             "Public names whose private module no area lists yet (docs/site_src/hooks.py, "
             "`AREAS`).")
# Each area's page shows the whole public surface of these submodules.
SUBMODULE_AREAS = {"functional": "nnx_pool.functional", "reference": "nnx_pool.reference"}

# What the repository contributes as it is: (glob under ROOT, or a file).
SOURCES = ("README.md", "CHANGELOG.md", "guides/*.md", "guides/figures/*", "docs/*.md",
           "docs/*.png", "docs/evidence/**/*")
# The regression kit's generated pages.
KIT_PAGES = (("kit/cli.md", "Command line"), ("kit/fixture.md", "The nnx_regression fixture"),
             ("kit/api.md", "Python API"))


def _reference_path(slug: str) -> str:
  return f"reference/{slug}.md"


def _public_areas() -> list[tuple[str, str, list[str], str]]:
  """Each area with its public names (``nnx_pool.X``), the catch-all last if it has any."""
  import nnx_pool

  known = {module: slug for slug, _, modules, _ in AREAS for module in modules}
  names: dict[str, list[str]] = {}
  for name, module in nnx_pool._WHERE.items():
    slug = known.get(module)
    if slug is None:
      log.info("nnx_pool.%s comes from %s, which no area of docs/site_src/hooks.py lists: it "
               "goes on the catch-all page %s", name, module, _reference_path(CATCH_ALL[0]))
      slug = CATCH_ALL[0]
    names.setdefault(slug, []).append(f"nnx_pool.{name}")
  for slug, module in SUBMODULE_AREAS.items():
    names[slug] = [f"{module}.{name}" for name in importlib.import_module(module).__all__]
  areas = [(slug, title, names.get(slug, []), text) for slug, title, _, text in AREAS]
  if CATCH_ALL[0] in names:
    areas.append((CATCH_ALL[0], CATCH_ALL[1], names[CATCH_ALL[0]], CATCH_ALL[2]))
  return areas


def _module_intro(modules: Iterable[str], *, heading: bool = False) -> str:
  """The docstrings of a page's modules, without their members; a public module's with its
  heading, so that it has an entry (and an anchor) of its own."""
  shown = "true" if heading else "false"
  return "".join(
      f"::: {module}\n    options:\n      members: false\n      show_root_heading: {shown}\n"
      f"      show_root_toc_entry: {shown}\n      show_root_full_path: true\n\n"
      for module in modules)


def reference_page(slug: str, title: str, names: list[str], text: str) -> str:
  """One area's page: what it covers, its modules' docstrings, then each public name."""
  import nnx_pool

  if slug in SUBMODULE_AREAS:
    modules = [SUBMODULE_AREAS[slug]]
  else:
    where = [nnx_pool._WHERE[name.split(".")[-1]] for name in names]
    modules = [f"nnx_pool.{m}" for m in dict.fromkeys(where)]
  parts = [f"# {title}\n\n{text}\n\n", _module_intro(modules, heading=slug in SUBMODULE_AREAS)]
  parts += [f"::: {name}\n\n" for name in names]
  return "".join(parts)


def reference_index(areas: list[tuple[str, str, list[str], str]]) -> str:
  lines = ["# API reference\n",
           "Every public name of `nnx_pool`, `nnx_pool.functional` and `nnx_pool.reference`, "
           "by area, as the code documents it (signature, arguments, returns, errors, "
           "examples). `import nnx_pool` gives the names below; the private modules "
           "(`nnx_pool._pool`, ...) may change without notice.\n",
           "| area | names |", "|---|---|"]
  for slug, title, names, _ in areas:
    links = ", ".join(f"[`{n.split('.')[-1]}`][{n}]" for n in names)
    lines.append(f"| [{title}]({slug}.md) | {links} |")
  return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# The regression kit: the command line from its parser, the fixture, the Python API.
# --------------------------------------------------------------------------------------


def _cell(text: str | None) -> str:
  return (text or "").replace("|", "\\|").replace("\n", " ")


def _usage(parser: argparse.ArgumentParser) -> str:
  formatter = argparse.HelpFormatter(parser.prog, width=90)
  formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
  return formatter.format_help().strip()


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
  rows = ["| argument | value | default | what it does |", "|---|---|---|---|"]
  for action in parser._actions:
    if isinstance(action, argparse._HelpAction):
      continue
    name = ", ".join(action.option_strings) or (action.metavar or action.dest)
    if action.choices is not None:
      value = " \\| ".join(f"`{c}`" for c in action.choices)
    elif action.nargs == 0:
      value = "(a flag)"
    else:
      value = f"`{action.metavar or action.dest.upper()}`"
      if action.nargs in ("*", "+", argparse.REMAINDER):
        value += " ..."
    default = action.default
    shown = "" if default in (None, False, argparse.SUPPRESS) else f"`{default}`"
    rows.append(f"| `{name}` | {value} | {_cell(shown)} | {_cell(action.help)} |")
  return rows


def cli_page() -> str:
  """Every command and option of ``nnx-pool-regression``, from the parser ``main`` runs."""
  from nnx_pool.regression import cli

  parser = cli.make_parser()
  commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
  helps = {action.dest: action.help for action in commands._choices_actions}
  lines = ["# Command line\n",
           "`python -m nnx_pool.regression COMMAND` or `nnx-pool-regression COMMAND`. This page "
           "is written from the argparse parser the command runs (`nnx_pool.regression.cli`), "
           "so it lists exactly the commands and options that exist; "
           "[the kit's page](../docs/regression.md) explains them at length.\n",
           f"```text\n{_usage(parser)}\n```\n",
           "| command | what it does |", "|---|---|"]
  lines += [f"| [`{name}`](#{name}) | {_cell(helps.get(name))} |" for name in commands.choices]
  lines.append("")
  for name, sub in commands.choices.items():
    lines.append(f"## `{name}` {{#{name}}}\n")
    lines.append(f"```text\n{_usage(sub)}\n```\n")
    for text in (sub.description or helps.get(name), sub.epilog):
      if text:
        lines.append(f"{text}\n")
    lines += [*_option_rows(sub), ""]
  lines.append("## The module's documentation\n\n::: nnx_pool.regression.cli\n    options:\n"
               "      members: false\n      show_root_heading: false\n"
               "      show_root_toc_entry: false\n")
  return "\n".join(lines)


class _OptionRecorder:
  """Stands in for pytest's parser and option group: records ``addoption``/``addini``."""

  def __init__(self) -> None:
    self.options: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    self.ini: list[tuple[str, str]] = []

  def getgroup(self, *args: Any, **kwargs: Any) -> _OptionRecorder:
    return self

  def addoption(self, *names: str, **kwargs: Any) -> None:
    self.options.append((names, kwargs))

  def addini(self, name: str, help: str, *args: Any, **kwargs: Any) -> None:
    self.ini.append((name, help))


def fixture_page() -> str:
  from nnx_pool.regression import pytest_plugin

  recorder = _OptionRecorder()
  pytest_plugin.pytest_addoption(recorder)  # type: ignore[arg-type]
  lines = ["# The `nnx_regression` fixture\n",
           "The package registers a pytest plugin (entry point `pytest11`), so a test that "
           "asks for `nnx_regression` gets the object below. Guide 10 "
           "([Guarding your own model](../guides/10-guarding-your-own-model.md)) walks through "
           "it on a ResNet; [the kit's page](../docs/regression.md#your-own-models-the-pytest-"
           "fixture) says what a baseline holds.\n",
           "## Command-line options\n",
           "Written from the plugin's `pytest_addoption`:\n",
           "| option | what it does |", "|---|---|"]
  for names, kwargs in recorder.options:
    flag = ", ".join(names)
    if kwargs.get("metavar"):
      flag += f" {kwargs['metavar']}"
    lines.append(f"| `{flag}` | {_cell(kwargs.get('help'))} |")
  for name, text in recorder.ini:
    lines.append(f"| `{name}` (ini) | {_cell(text)} |")
  lines += ["", "## The plugin\n",
            "::: nnx_pool.regression.pytest_plugin\n    options:\n      members: false\n"
            "      show_root_heading: false\n      show_root_toc_entry: false\n",
            "::: nnx_pool.regression.pytest_plugin.nnx_regression\n",
            "::: nnx_pool.regression.pytest_plugin.Regression\n"]
  return "\n".join(lines)


def kit_api_page() -> str:
  import nnx_pool.regression as kit

  names = list(kit.__all__)
  lines = ["# The kit's Python API\n",
           "The kit's public surface is its [command line](cli.md), the "
           "[`nnx_regression` fixture](fixture.md) with its `check` and `check_grad`, the "
           "baseline format on disk ([the kit's page](../docs/regression.md#the-baseline-on-"
           "disk)), and the names that `nnx_pool.regression.__all__` lists: "
           + ", ".join(f"`{n}`" for n in names) + ". Its other modules (`store`, `compare`, "
           "`runner`, ...) are how the command line and the fixture work, and may change "
           "between versions without notice.\n",
           "::: nnx_pool.regression\n    options:\n      members: false\n"
           "      show_root_heading: false\n      show_root_toc_entry: false\n"]
  lines += [f"::: nnx_pool.regression.{name}\n" for name in names]
  return "\n".join(lines)


# --------------------------------------------------------------------------------------
# The benchmark chart.
# --------------------------------------------------------------------------------------

CHART = "docs/benchmarks-ratios.svg"


def benchmark_chart() -> bytes:
  """A bar per case and pass: ours over the faster peer, from docs/benchmarks.json."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  report = json.loads((ROOT / "docs" / "benchmarks.json").read_text())
  labels, ratios = [], []
  for row in report["rows"]:
    for key, name in (("forward", "fwd"), ("backward", "fwd+bwd"), ("step", "train step")):
      if key in row:  # the solo harness's "ratio"; the in-process one's "ratio_to_best_peer"
        labels.append(f"{row['case']}, {name}")
        ratios.append(row[key].get("ratio", row[key].get("ratio_to_best_peer")))
  with plt.rc_context({"svg.hashsalt": "nnx-pool", "font.size": 9}):
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(labels) + 1.2))
    colours = ["#2e7d32" if r <= 1 else "#c62828" for r in ratios]
    ax.barh(range(len(labels)), ratios, color=colours)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ours / the faster of flax.nnx and PyTorch (at or below 1: target met)")
    environment = report.get("environment", {})
    ax.set_title(f"CPU, jax {environment.get('jax', '?')}, {environment.get('date', '')[:10]}")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
  return out.getvalue()


def _with_chart(markdown: str) -> str:
  """The benchmark page with the chart after its first table."""
  section = ("\n**The ratios, drawn.** Each bar is a row's median ratio in the table above, "
             "drawn when the site is built from `docs/benchmarks.json`; green meets the target "
             "(at or below 1.00), red does not.\n\n"
             "![Bars of ours over the faster peer per case and pass, a line at 1.00]"
             "(benchmarks-ratios.svg)\n\n")
  lines = markdown.splitlines(keepends=True)
  for i, line in enumerate(lines):
    if line.startswith("|") and (i + 1 == len(lines) or not lines[i + 1].startswith("|")):
      return "".join(lines[:i + 1]) + section + "".join(lines[i + 1:])
  return markdown + section


# --------------------------------------------------------------------------------------
# The hooks.
# --------------------------------------------------------------------------------------

_ANCHORS: dict[str, tuple[str, str]] = {}  # a code name -> (page URL, anchor)


def on_config(config: Any) -> Any:
  lay_out(PACKAGE_COPY)
  areas = _public_areas()
  guides = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "guides").glob("[0-9]*.md"))
  config["nav"] = [
      {"Home": "README.md"},
      {"Installing": "docs/install.md"},
      {"Guides": ["guides/README.md", *guides]},
      {"The modules at a glance": "docs/modules.md"},
      {"API reference": ["reference/index.md",
                         *({title: _reference_path(slug)} for slug, title, _, _ in areas)]},
      {"The regression kit": ["docs/regression.md",
                              *({title: path} for path, title in KIT_PAGES),
                              {"Evidence": "docs/evidence/README.md"}]},
      {"Errors": "docs/errors.md"},
      {"Limits": "docs/limits.md"},
      {"Benchmarks": "docs/benchmarks.md"},
      {"Working on nnx-pool": "docs/development.md"},
      {"Changelog": "CHANGELOG.md"},
  ]
  return config


def on_files(files: Files, config: Any) -> Files:
  for pattern in SOURCES:
    for path in sorted(ROOT.glob(pattern)):
      if path.is_file():
        files.append(File.generated(config, path.relative_to(ROOT).as_posix(),
                                    abs_src_path=str(path)))
  areas = _public_areas()
  files.append(File.generated(config, "reference/index.md", content=reference_index(areas)))
  _ANCHORS.clear()
  for slug, title, names, text in areas:
    page = _reference_path(slug)
    files.append(File.generated(config, page, content=reference_page(slug, title, names, text)))
    for name in names:
      url = page[:-3] + ".html"
      short = name.split(".")[-1]
      _ANCHORS[name] = (url, name)
      if not name.startswith("nnx_pool.reference."):  # reference's names repeat functional's
        _ANCHORS.setdefault(short, (url, name))
  for module in SUBMODULE_AREAS.values():
    _ANCHORS[module] = (_reference_path(module.split(".")[-1])[:-3] + ".html", "")
  makers = {"kit/cli.md": cli_page, "kit/fixture.md": fixture_page, "kit/api.md": kit_api_page}
  for path, _ in KIT_PAGES:
    files.append(File.generated(config, path, content=makers[path]()))
  files.append(File.generated(config, CHART, content=benchmark_chart()))
  for file in files:
    if file.src_uri.endswith(".py"):
      file.inclusion = InclusionLevel.EXCLUDED
  return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
  if page.file.src_uri == "docs/benchmarks.md":
    return _with_chart(markdown)
  return markdown


# Segments left alone (links, headings, code blocks), or a code span that may be a name.
_SEGMENT = re.compile(
    r"<a\b.*?</a>|<h[1-6]\b.*?</h[1-6]>|<pre\b.*?</pre>|<code\b[^>]*class=.*?</code>"
    r"|(?::(?:class|func|meth|mod|data|attr|exc|obj):)?<code>([A-Za-z_][\w.]*)</code>",
    re.DOTALL)
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):(?=<code>)")


def on_page_content(html_text: str, page: Any, config: Any, files: Files) -> str:
  here = page.file.dest_uri

  def link(match: re.Match[str]) -> str:
    name = match.group(1)
    if name is None:
      return match.group(0)
    code = f"<code>{html.escape(name, quote=False)}</code>"
    target = _ANCHORS.get(name) or _ANCHORS.get(name.removeprefix("nnx_pool."))
    if target is None:
      return code
    url, anchor = target
    href = posixpath.relpath(url, posixpath.dirname(here) or ".")
    if url == here:
      href = ""
    return f'<a href="{href}{"#" + anchor if anchor else ""}">{code}</a>'

  return _ROLE.sub("", _SEGMENT.sub(link, html_text))


def on_post_build(config: Any) -> None:
  log.info("nnx_pool: site written to %s", os.path.relpath(config["site_dir"], ROOT))
