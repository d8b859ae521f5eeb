"""Other versions of jax and flax: ``rehearse`` (check in a throwaway environment) and ``bisect``
(which release between two moved the numbers).

* :mod:`.rehearse_plan`: the requirements over this environment's pins, and the plan they make;
* :mod:`.rehearse_source`: where this nnx-pool is installed from (a checkout, a URL, the index);
* :mod:`.rehearse_env`: the environment built with venv and pip, kept current, and check run
  there; :mod:`.pip_messages`: pip's refusals in one line;
* :mod:`.rehearse_pytest`: the user's tests run there, guarded, and their result read back;
* :mod:`.rehearse_cache`: the cached environments, their manifests and locks;
* :mod:`.preflight`: what rehearse and bisect judge before building anything;
* :mod:`.rehearse`: ``rehearse`` itself, its report marked with what it changed;
* :mod:`.bisect_plan`: the releases between two sets and the halving;
  :mod:`.bisect_here`: whether a step may run in this environment;
  :mod:`.bisect_steps`: one release recorded or checked; :mod:`.bisect`: the walk.
"""
