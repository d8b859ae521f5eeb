"""nnx-pool's regression kit: version-stamped numeric baselines and a checker.

* ``python -m nnx_pool.regression check`` (or ``nnx-pool-regression check``) runs the
  canonical batch (:mod:`nnx_pool.regression.batch`) and compares it with the shipped
  baseline; ``record``, ``diff`` and ``info`` complete the CLI
  (:mod:`nnx_pool.regression.cli`). ``rehearse jax==0.9.2`` runs ``check`` in a throwaway
  environment with other versions, leaving this one as it is
  (:mod:`nnx_pool.regression.upgrade.rehearse`), and ``bisect --good SPEC --bad SPEC``
  halves the releases between two requirement sets to name the one that moved the numbers
  (:mod:`nnx_pool.regression.upgrade.bisect`).
* :mod:`nnx_pool.regression.pytest_plugin` gives users' tests an ``nnx_regression``
  fixture over the same baseline format; :class:`nnx_pool.regression.guard.Guard` is the
  same without pytest.

A baseline is a directory with ``manifest.json`` and the ``arrays-<digest>.npz`` it names
(:mod:`nnx_pool.regression.store`), stamped with the environment
(:mod:`nnx_pool.regression.stamp`), compared under stated per-dtype tolerances
(:mod:`nnx_pool.regression.tolerance`, :mod:`nnx_pool.regression.compare`).

The rooms (folders) of the kit, and the modules at the top:

* ``store/``: baselines on disk: the format, the atomic writer, the checked reader, the lock;
* ``compare/``: what counts as the same number (the tolerance policy) and the verdict;
* ``report/``: what a command found: its data and JSON, the terminal table, the HTML page;
* ``batch/``: the kit's own cases, their inputs and runner, and record, check and diff;
* ``fixture/``: the fixture's numeric side: running a check, its files and weight sets,
  the tolerance policy, the comparison and its headline, the exported program and the
  attribution of a failure to the program or the compiler, and ``model_state/`` (schema,
  modes, weights, layers);
* ``upgrade/``: other versions: rehearse's plan, environments, cache and source, the
  installer (uv, or pip) and the installers' messages, and bisect's plan, steps and walk,
  by release and by date;
* ``cli/``: the command line: parser, dispatch, outputs, progress line, the upgrade
  commands, ``--devices``, ``launch``;
* ``processes/``: a model whose arrays span processes (``jax.distributed``): the launcher
  of N local processes and the variables it sets, the initializer that reads them, the
  agreement of the processes at each check, the guard's and the batch's checks across
  processes;
* at the top: the doors users name (``pytest_plugin``, ``guard``, ``commands``, the
  ``tolerance`` policy's public path), the pipeline the batch and the fixture share
  (``runner``), the environment stamp (``stamp``), the names every room shares
  (``constants``) and the one-line telling of an exception (``describe``).

Where coming work lands: weight renames and reshapes, and per-layer scales, in
``fixture/model_state/`` (``weights``, ``renames``, ``first_moved``); other installers (uv)
beside pip in ``upgrade/`` (``rehearse_env``, ``pip_messages``) and bisection by date in
``upgrade/bisect_plan``; exported programs and program-or-compiler attribution as a room of
their own beside ``fixture/``; other ways to start processes (one GPU per local process)
in ``processes/launcher``.
"""

from .constants import FORMAT_VERSION as FORMAT_VERSION

__all__ = ["FORMAT_VERSION"]
