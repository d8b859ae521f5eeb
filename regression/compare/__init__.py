"""Comparison: what counts as the same number, and whether two arrays are.

* :mod:`.tolerance`: the tolerance policy, per kind of computation, role and dtype, each
  tolerance with its reason (public path: :mod:`nnx_pool.regression.tolerance`);
* :mod:`.arrays`: two arrays under a tolerance, and the verdict (NaN, infinities, the
  largest errors, the first failing index).

NumPy only: no JAX here.
"""

from .arrays import Verdict, compare_arrays, failing_elements, json_float

__all__ = ["Verdict", "compare_arrays", "failing_elements", "json_float"]
