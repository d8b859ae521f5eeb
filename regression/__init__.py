"""nnx-pool's regression kit: version-stamped numeric baselines and a checker.

* ``python -m nnx_pool.regression check`` (or ``nnx-pool-regression check``) runs the
  canonical batch (:mod:`nnx_pool.regression.batch`) and compares it with the shipped
  baseline; ``record``, ``diff`` and ``info`` complete the CLI
  (:mod:`nnx_pool.regression.cli`). ``rehearse jax==0.9.2`` runs ``check`` in a throwaway
  environment with other versions, leaving this one as it is
  (:mod:`nnx_pool.regression.upgrade.rehearse`), and ``bisect --good SPEC --bad SPEC`` halves the
  releases between two requirement sets to name the one that moved the numbers
  (:mod:`nnx_pool.regression.upgrade.bisect`).
* :mod:`nnx_pool.regression.pytest_plugin` gives users' tests an ``nnx_regression``
  fixture over the same baseline format.

A baseline is a directory with ``manifest.json`` and the ``arrays-<digest>.npz`` it names
(:mod:`nnx_pool.regression.store`), stamped with the environment
(:mod:`nnx_pool.regression.stamp`), compared under stated per-dtype tolerances
(:mod:`nnx_pool.regression.tolerance`, :mod:`nnx_pool.regression.compare`).
"""

from .constants import FORMAT_VERSION as FORMAT_VERSION

__all__ = ["FORMAT_VERSION"]
