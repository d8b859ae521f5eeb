"""The documentation site as a reader meets it: built, then opened in headless Chromium.

``make test-site`` runs these (``-m site``); the default suite skips them, as they build
the site (about 10 s) and drive a browser. They need the ``docs`` extra (mkdocs,
mkdocs-material, mkdocstrings, Playwright) and Debian's ``chromium`` at /usr/bin/chromium
(``apt-get install -y chromium``; ``NNX_POOL_CHROMIUM`` names another). The site is opened
from disk (``file://``), as ``site/index.html`` is read after ``make docs``.

With ``NNX_POOL_SITE_SHOTS=DIR`` set, the reference page of ``MaxPool`` and a guide page are
also saved as ``DIR/site-maxpool-reference.png`` and ``DIR/site-guide.png`` (``make
docs-screenshots`` writes them into docs/).
"""

from __future__ import annotations

import html
import html.parser
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

import nnx_pool
import nnx_pool.functional
import nnx_pool.reference
import nnx_pool.regression
from nnx_pool.regression import pytest_plugin
from nnx_pool.regression.store import write_atomic

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("NNX_POOL_CHROMIUM", "/usr/bin/chromium")
# Chromium's flags for a closed network: without the networking ones it keeps trying to reach
# its update, sync and field-trial servers.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.site,
    pytest.mark.skipif("'site' not in (config.getoption('markexpr') or '')",
                       reason="builds the site and drives a browser: `make test-site` (-m site)"),
]


class _Text(html.parser.HTMLParser):
  """A page's visible text, with whitespace collapsed."""

  def __init__(self) -> None:
    super().__init__()
    self.parts: list[str] = []
    self._skip = 0

  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    self._skip += tag in ("script", "style")

  def handle_endtag(self, tag: str) -> None:
    self._skip -= tag in ("script", "style")

  def handle_data(self, data: str) -> None:
    if not self._skip:
      self.parts.append(data)


def _squash(text: str) -> str:
  return " ".join(text.split())


def page_text(path: Path) -> str:
  parser = _Text()
  parser.feed(path.read_text(encoding="utf-8"))
  return _squash(html.unescape("".join(parser.parts)))


def first_sentence(doc: str) -> str:
  """The docstring's first sentence as the site shows it: reST markup dropped."""
  paragraph = _squash(doc.split("\n\n")[0])
  match = re.match(r"(.+?[.:;])(\s|$)", paragraph)
  sentence = match.group(1) if match else paragraph
  sentence = re.sub(r":(?:class|func|meth|mod|data|attr|exc|obj):", "", sentence)
  return sentence.replace("``", "").replace("`", "")


def public_objects() -> dict[str, object]:
  """Every public name of nnx_pool, its functional and reference twins, and the kit."""
  names: dict[str, object] = {}
  for module in (nnx_pool, nnx_pool.functional, nnx_pool.reference, nnx_pool.regression):
    for name in module.__all__:
      names[f"{module.__name__}.{name}"] = getattr(module, name)
  names["nnx_pool.regression.pytest_plugin.nnx_regression"] = pytest_plugin.nnx_regression
  names["nnx_pool.regression.pytest_plugin.Regression"] = pytest_plugin.Regression
  return names


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
  out = tmp_path_factory.mktemp("site")
  start = time.perf_counter()
  built = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
      cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert built.returncode == 0, built.stdout + built.stderr
  print(f"mkdocs build --strict: {time.perf_counter() - start:.1f} s")
  return out


@pytest.fixture(scope="module")
def browser():
  from playwright.sync_api import sync_playwright

  assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: apt-get install -y chromium"
  with sync_playwright() as playwright:
    launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield launched
    launched.close()


def _pages(site: Path) -> list[Path]:
  return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_every_public_name_is_on_the_site_with_its_docstrings_first_sentence(site):
  text = " ".join(page_text(page) for page in _pages(site))
  ids = set(re.findall(r'id="([^"]+)"', " ".join(p.read_text() for p in _pages(site))))
  missing_name, missing_doc = [], []
  for path, value in public_objects().items():
    # The reference documents each name where the public path points (nnx_pool.MaxPool);
    # functional's and the kit's names under their modules.
    if path not in ids:
      missing_name.append(path)
    if inspect.isclass(value) or inspect.isroutine(value) or inspect.ismodule(value):
      doc = inspect.getdoc(value)
      assert doc, f"{path} has no docstring"
      if first_sentence(doc) not in text:
        missing_doc.append(f"{path}: {first_sentence(doc)!r}")
  assert missing_name == [], f"public names without a reference entry: {missing_name}"
  assert missing_doc == [], "docstrings whose first sentence is not on the site:\n" + "\n".join(
      missing_doc)


def test_every_page_loads_with_no_console_error_and_every_internal_link_resolves(site, browser):
  page = browser.new_page()
  problems: list[str] = []
  current = [""]
  page.on("console", lambda m: m.type == "error" and problems.append(f"{current[0]}: {m.text}"))
  page.on("pageerror", lambda e: problems.append(f"{current[0]}: {e}"))
  page.on("requestfailed", lambda r: problems.append(f"{current[0]}: {r.url} {r.failure}"))
  links: dict[str, set[str]] = {}  # target URL (no fragment) -> fragments asked for
  ids: dict[str, set[str]] = {}
  external = set()
  for path in _pages(site):
    url = path.as_uri()
    current[0] = str(path.relative_to(site))
    page.goto(url)
    page.wait_for_load_state("load")
    ids[url] = set(page.eval_on_selector_all("[id], a[name]",
                                             "els => els.map(e => e.id || e.name)"))
    for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
      if href.startswith("file:"):
        target, fragment = urldefrag(href)
        links.setdefault(target, set()).add(unquote(fragment))
      else:
        external.add(href)
  page.close()
  assert problems == [], "\n".join(problems)
  broken = [target for target in links if not Path(unquote(urlsplit(target).path)).exists()]
  assert broken == [], f"links to files that do not exist: {broken}"
  missing = []
  for target, fragments in links.items():
    if target.endswith(".html") and target in ids:
      missing += [f"{target}#{f}" for f in sorted(fragments) if f and f not in ids[target]]
  assert missing == [], "links to anchors that do not exist:\n" + "\n".join(missing)
  # External links cannot be followed here (no network); they are only the few in the text.
  assert all(href.startswith(("https://", "http://", "mailto:")) for href in external), external
  assert len(ids) == len(_pages(site)) > 30  # the walk saw every page


@pytest.mark.parametrize("query, expected", [
    ("count_include_pad", "count_include_pad"),
    ("MaxPool", "MaxPool"),
])
def test_the_search_box_finds(site, browser, query, expected):
  page = browser.new_page()
  page.goto((site / "index.html").as_uri())
  page.click("label.md-search__icon, .md-search__input", timeout=5000)
  # Typed key by key, as a reader does: the search listens to the keyboard.
  page.locator("input.md-search__input").press_sequentially(query, delay=20)
  results = page.locator(".md-search-result__item")
  results.first.wait_for(timeout=10000)
  found = results.all_inner_texts()
  page.close()
  assert any(expected in item for item in found), found


def test_the_maxpool_reference_shows_its_signature(site, browser):
  page = browser.new_page(viewport={"width": 1280, "height": 900})
  page.goto((site / "reference" / "window-pools.html").as_uri() + "#nnx_pool.MaxPool")
  heading = page.locator('[id="nnx_pool.MaxPool"]')
  assert "MaxPool" in heading.inner_text()
  signature = page.locator('[id="nnx_pool.MaxPool"] + .doc-signature')
  text = _squash(signature.inner_text())
  # The signature as _pool.py declares it (the __init__ merged into the class).
  for part in ("MaxPool(", "window_shape", "strides", "padding", "VALID", "*",
               "num_spatial_dims", "dilation", "ceil_mode", "return_indices", "in_features"):
    assert part in text, (part, text)
  shots = os.environ.get("NNX_POOL_SITE_SHOTS")
  if shots:
    page.evaluate("document.getElementById('nnx_pool.MaxPool').scrollIntoView()")
    write_atomic(Path(shots) / "site-maxpool-reference.png", page.screenshot())
    page.goto((site / "guides" / "03-max-pooling.html").as_uri())
    write_atomic(Path(shots) / "site-guide.png", page.screenshot())
  page.close()
