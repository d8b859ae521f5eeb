"""Command line: ``python -m nnx_pool.regression`` or the ``nnx-pool-regression`` script.

Commands:

* ``check [--baseline DIR] [--json OUT] [--html OUT] [--timing] [-k PATTERN]
  [--dry-run] [--devices N [--axis-types explicit|auto]]``: runs the batch after
  JIT warmup and compares it with the baseline (default: the shipped one).
  ``--timing`` lists the timing totals and every case whose timing moved; by default
  one line counts those cases (another machine's times differ for that alone). A ``-k``
  that selects no case exits 2. ``--html OUT`` also writes one
  self-contained page (:mod:`nnx_pool.regression.report.html`): both stamps, the table,
  and heatmaps of every failing array; it needs matplotlib, the ``report``
  extra, and without it exits 2 naming the install command before running anything.
  With ``--devices N`` the batch runs sharded over N devices (simulated CPU
  devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` is set before
  JAX initialises, re-running the command in a fresh interpreter when this one
  already initialised JAX) and is compared with the same baseline.
* ``record [--out DIR] [--force] [-k PATTERN] [--json OUT]``: runs the batch and writes a
  baseline atomically. Without ``--out`` it re-records the shipped baseline,
  and only in a source checkout, from a clean tree: an installed package is never written.
  ``-k`` records the cases it selects: a partial baseline that says so, or, into an
  existing one with ``--force``, merged (:mod:`nnx_pool.regression.batch.record`).
* ``diff A B [--json OUT]``: compares two recorded baselines.
* ``info [--json OUT]``: prints the current environment stamp.
* ``report DIR [--obtained OBTAINED] [--json OUT] [--html OUT]``: the report of the last
  failing check of a pytest fixture baseline, from the baseline and the ``DIR.obtained``
  file that check wrote beside it (or ``OBTAINED``, where a check-only run wrote it),
  without running the model.
* ``rehearse REQ... [--baseline DIR] [--json OUT] [--html OUT] [--timing] [-k PATTERN]
  [--dry-run] [--resolve] [--no-cache] [--no-batch] [--pytest [PATH...] [-- ARG...]]``:
  runs ``check`` in a
  throwaway virtual environment that holds this nnx-pool and its dependencies at the
  versions installed here, except what the PEP 508 requirements REQ name
  (``jax==0.9.2``), against a baseline of this environment, and prints the same report,
  the versions it changed marked ``(rehearsal)``. This environment is never modified.
  ``--resolve`` lets pip choose older versions of the packages that depend on a
  requirement (flax for jax). Environments are cached per requirement set, the three
  used most recently kept (:func:`nnx_pool.regression.upgrade.rehearse_cache.cache_root`);
  ``rehearse --clear-cache`` empties the cache. ``--pytest`` also runs your
  ``nnx_regression`` tests there, comparing only; every argument after ``--`` goes to that
  pytest untouched (``--pytest tests -- -k logits``), and ``--no-batch`` runs only them.
  See :mod:`nnx_pool.regression.upgrade.rehearse`.
* ``bisect --good SPEC --bad SPEC [--resolve] [--pre] [-k PATTERN] [--html OUT]
  [--no-batch] [--pytest [PATH...] [-- ARG...]]``: finds the release that moved the numbers.
  SPEC is a requirement set as ``rehearse`` takes it, quoted as one argument
  (``'jax==0.9.0'``, ``'jax==0.10.2 flax==0.12.8'``); the two may differ in one package
  (jax with its jaxlib counts as one). It records the baselines in the good set's
  environment (into a temporary directory), checks them in the bad set's, then halves the
  registry's releases between them, in the rehearsal cache's environments, and names the
  first release whose check fails. See :mod:`nnx_pool.regression.upgrade.bisect`.

* ``launch -n N [--local-devices K] [--wait S] [--grace S] [--timeout S] -- COMMAND...``:
  runs the command in N local processes of one JAX run (``jax.distributed``, gloo) over
  N x K simulated CPU devices, each line relayed with its process's id, and exits with one
  status; the pytest plugin and ``check`` start the runtime from the variables it sets. See
  :mod:`nnx_pool.regression.processes.launcher`.

On a terminal, ``check`` and ``record`` show which case runs (``check: case 17/104
max_k2s1_ties_zeros ...``) on one line of stderr that is rewritten in place and cleared
at the end; when stderr is not a terminal (piped, redirected, CI) nothing extra is
printed. ``rehearse`` shows its steps there (``rehearse: step 2/3 installing ...``).

Exit codes: 0 everything passed; 1 a number moved, an error case stopped
raising, a case failed to run, or the baseline is out of date (NEW, GONE,
STALE cases); 2 the batch could not be imported or built (with its
traceback), the baseline is missing, damaged, of a newer format, or may not
be written (including a full disk), or too few devices, or a ``--json`` or ``--html``
file cannot be written or lies inside a baseline's directory (checked before anything runs,
and again when it is written),
with a one-line reason on stderr. ``rehearse`` exits with ``check``'s code, or 2 with a one-line
reason naming the requirement pip could not install; with ``--pytest``, with the worse
of that and pytest's (failed tests 1; no tests collected, a usage error or an
interrupted run 2). ``bisect`` exits 1 when it names a first moved release, 0 when the
bad set passes after all, and 2 on bad input (the two sets the same, more than one package
differing, no release between them) or a set that cannot be installed or recorded.

The batch (and with it ``nnx_pool`` and JAX) is imported inside :func:`main`,
so that a failure to import it is reported with exit code 2, not mistaken
for a number that moved.

The command line's modules: :mod:`.parser` (the commands and their options),
:mod:`.dispatch` (:func:`main`: parse, run, print, exit code), :mod:`.outputs` (the report
printed, ``--json`` and ``--html`` checked before anything runs), :mod:`.progress` (the
progress line on a terminal), :mod:`.upgrade_commands` (``rehearse`` and ``bisect``) and
:mod:`.devices` (``--devices N``) and :mod:`.launch` (``launch``).
"""

from .dispatch import main, run
from .parser import make_parser

__all__ = ["main", "make_parser", "run"]
