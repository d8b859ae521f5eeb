"""``python -m regression``: see :mod:`regression.cli`."""

import sys

from regression.cli import main

if __name__ == "__main__":
  sys.exit(main())
