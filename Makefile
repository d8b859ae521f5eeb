# Two entry points, each of which creates (once) and reuses a local virtual
# environment in .venv:
#   make check   the regression check against the shipped baseline
#   make test    the whole test suite
# and, for maintainers: make test-quick (the suite without the tests marked slow),
# make test-rehearsal (rehearse jax 0.9.2 against the shipped baseline, bisect jax 0.9.0
# to 0.10.2 and by date, with real wheels),
# make lint (ruff), make baseline (re-record the shipped baseline), make bench,
# make docs (the site in site/), make test-site (the site in headless Chromium),
# make docs-screenshots, make typecheck (pyright).
# EXTRAS selects the optional dependencies; CI adds `parity` (PyTorch 2.13 CPU).
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= test
CONSTRAINTS ?= constraints.txt
comma := ,
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: check test test-quick test-rehearsal test-integration test-floor lint baseline bench clean docs test-site \
	docs-screenshots typecheck

$(STAMP): pyproject.toml $(CONSTRAINTS) tools/link_layout.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# setuptools >= 77 reads the SPDX license string; tests/test_install.py builds the
	# wheel with this venv's own setuptools (no build isolation), and a fresh venv has 65.
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=77"
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	# The editable install maps regression/ with an import hook, which type checkers and
	# editors cannot follow: links they can read (tools/link_layout.py says why).
	$(BIN)/python tools/link_layout.py
	touch $@

check: $(STAMP)
	$(BIN)/python -m nnx_pool.regression check

# Re-records regression/baseline/ (the one the package ships) in place, from a clean tree
# (record refuses a checkout with uncommitted changes: the stamp names the commit).
baseline: $(STAMP)
	$(BIN)/python -m nnx_pool.regression record --out regression/baseline --force

# Two pytest-xdist workers, a file per worker (measured on 2 cores: the quick subset
# 450 s serial, 268 s so); XDIST= runs serially.
XDIST ?= -n 2 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# The tests marked `rehearsal`, wherever they lie under tests/ (`make test` leaves them out):
# `rehearse` installs jax and jaxlib 0.9.2 (with flax 0.12.6, the newest flax that admits
# them) from the registry into a fresh venv and checks the shipped baseline there (about a
# minute); `bisect` walks jax 0.9.0 to 0.10.2 for a test that moves at 0.10.0 (three fresh
# environments, about three minutes). Needs the network.
test-rehearsal: $(STAMP)
	$(BIN)/python -m pytest -m rehearsal tests $(PYTEST_ARGS)

# The tests marked `integration` (`make test` leaves them out): the 8-device sharding run,
# the device check's dry run, the 8 M-parameter ResNet's baselines against issue 23's
# targets (35 MB, 70 MB with store_params) and the 4 M-parameter EfficientNet under jit
# only; its own CI step (73 s on 2 cores).
test-integration: $(STAMP)
	$(BIN)/python -m pytest -m integration $(XDIST) $(PYTEST_ARGS)

lint:
	$(MAKE) $(VENV)/.installed-lint EXTRAS=lint
	$(BIN)/ruff check .

# The same suite on the oldest jax/flax that pyproject.toml admits (no torch).
test-floor:
	$(MAKE) test VENV=.venv-floor EXTRAS=test CONSTRAINTS=constraints-floor.txt

# The documentation site, from mkdocs.yml into site/; open site/index.html (no server needed).
# --strict: a broken link, anchor or reference fails the build. `docs` is also a folder, hence
# .PHONY above.
docs:
	$(MAKE) $(VENV)/.installed-docs EXTRAS=docs
	# The package as installed, for mkdocstrings' paths: laid out before mkdocs starts, since
	# the handler reads its paths before the hook's on_config runs (a fresh clone failed so).
	$(BIN)/python docs/site_src/installed_layout.py build/site-pkg
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# The site as a reader meets it (tests/test_site.py, marked `site`): built, then opened in
# Debian's chromium (apt-get install -y chromium) through Playwright.
test-site:
	$(MAKE) $(VENV)/.installed-test-docs EXTRAS=test,docs
	$(BIN)/python -m pytest -m site tests/test_site.py -n 0 $(PYTEST_ARGS)

# Re-takes docs/site-maxpool-reference.png and docs/site-guide.png from a fresh build.
docs-screenshots:
	$(MAKE) $(VENV)/.installed-test-docs EXTRAS=test,docs
	NNX_POOL_SITE_SHOTS=docs $(BIN)/python -m pytest -m site tests/test_site.py -n 0 -k signature

# pyright (basic mode, [tool.pyright] in pyproject.toml) over nnx_pool/ and regression/ as
# installed (copied to build/typecheck), a warning failing it as an error does; then a user's
# files through the public API, correct use and misuses, in a folder outside the repository
# with this venv's interpreter (tests/test_types.py, marked `typecheck`). The links are
# relaid first, so a module added since the venv was made is seen.
typecheck:
	$(MAKE) $(VENV)/.installed-test-typecheck EXTRAS=test,typecheck
	$(BIN)/python tools/link_layout.py
	$(BIN)/python docs/site_src/installed_layout.py build/typecheck
	$(BIN)/pyright --warnings --pythonpath $(BIN)/python
	$(BIN)/python -m pytest -m typecheck tests/test_types.py -n 0 $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf .venv .venv-floor .venv-docs build *.egg-info site
