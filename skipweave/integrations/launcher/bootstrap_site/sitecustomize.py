"""skipweave launcher bootstrap (``skipweave run``): weave the plan in ``SKIPWEAVE_PLAN`` at start-up.

``skipweave run`` puts this folder first on ``PYTHONPATH``, so every Python process of the launched
program (and its children: workers, ``torchrun`` ranks, Ray workers) imports this module at start-up.
It first runs the user's own ``sitecustomize`` (the next one on ``sys.path``), which this file would
otherwise hide, then registers skipweave's deferred weave.
"""

import os
import sys


def _run_user_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # the user's module is the one `import sitecustomize` finds
    spec.loader.exec_module(module)


def _bootstrap() -> None:
    try:
        from skipweave.integrations.launcher.bootstrap import bootstrap
    except ImportError as exc:  # another interpreter, without skipweave, inherited PYTHONPATH
        sys.stderr.write(f"skipweave: not woven in {sys.executable} (cannot import skipweave: {exc})\n")
        return
    bootstrap()


_run_user_sitecustomize()
_bootstrap()
