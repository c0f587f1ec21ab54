"""pdwarden's start-up hook (see pdwarden_runtime.sglang_boot for why it exists).

Python imports ``sitecustomize`` once at interpreter start. This one first runs the
``sitecustomize`` it shadows (the next one on sys.path), then, only when
PDWARDEN_HARDENING=1, arms the NIXL hardening in this process: it is installed as soon as
SGLang's NIXL backend loads. It must stay tiny and import nothing heavy: everything else
lives in pdwarden_runtime.sglang_boot.activate.
"""

import os
import sys


def _chain_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["_pdwarden_shadowed_sitecustomize"] = module


def _activate() -> None:
    if os.environ.get("PDWARDEN_HARDENING") != "1":
        return
    from pdwarden_runtime.sglang_boot.activate import arm_from_env

    arm_from_env()


try:
    _chain_shadowed_sitecustomize()
except Exception as err:  # theirs failing must not keep ours from running
    sys.stderr.write(f"pdwarden: the shadowed sitecustomize failed: {err!r}\n")
_activate()
