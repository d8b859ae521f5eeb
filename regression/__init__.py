"""nnx-pool's regression kit: version-stamped numeric baselines and a checker.

* ``python -m regression check`` (or ``nnx-pool-regression check``) runs the
  canonical batch (:mod:`regression.batch`) and compares it with the shipped
  baseline; ``record``, ``diff`` and ``info`` complete the CLI
  (:mod:`regression.cli`).
* :mod:`regression.pytest_plugin` gives users' tests an ``nnx_regression``
  fixture over the same baseline format.

A baseline is a directory with ``manifest.json`` and ``arrays.npz``
(:mod:`regression.store`), stamped with the environment
(:mod:`regression.stamp`), compared under stated per-dtype tolerances
(:mod:`regression.tolerance`, :mod:`regression.compare`).
"""

from regression.store import FORMAT_VERSION as FORMAT_VERSION

__all__ = ["FORMAT_VERSION"]
