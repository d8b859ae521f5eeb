# Two entry points, each of which creates (once) and reuses a local virtual
# environment in .venv:
#   make check   the regression check against the shipped baseline
#   make test    the whole test suite
# EXTRAS selects the optional dependencies; CI adds `parity` (PyTorch 2.13 CPU).
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= test
comma := ,
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: check test bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

check: $(STAMP)
	$(BIN)/python -m regression check

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
