"""Several processes: a model whose arrays span processes, under JAX's multi-controller
runtime (``jax.distributed``), guarded as on one.

* ``environment``: the variables that say this process is one of several (read without
  JAX), and :mod:`.initialize`, which starts the runtime from them, never on its own;
* ``launcher``: ``nnx-pool-regression launch -n N -- COMMAND``, N local processes of one run;
* ``group``: the agreement of the processes on each check (the runtime's key-value store and
  barrier, with a timeout), and ``gate``, the point before a check's first collective where
  it happens;
* ``arrays``: global arrays gathered whole, and the layout a check stamps;
* ``across``: the guard's check across processes (process 0 reads and writes, the others
  hear its verdict); ``batch``: the kit's ``check`` across processes;
* what the pytest plugin does in a launched process is ``initialize.join_problem``.
"""

from .initialize import initialize

__all__ = ["initialize"]
