"""``python -m nnx_pool.regression``: see :mod:`nnx_pool.regression.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
  sys.exit(main())
