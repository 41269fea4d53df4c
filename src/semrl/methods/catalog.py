"""The methods semrl knows: every folder of ``semrl.methods`` (each built-in method registers itself
when its package is imported; a method's package imports no torch), and your own modules loaded with
``load_plugins``.

Adding a method is adding one folder (docs/methods/adding.md): a package in ``src/semrl/methods/``
is found here by itself; a module elsewhere is named on the command line
(``semrl train --plugin my_method.py``) or imported before the config is loaded (Python API).
``semrl.config.load`` imports this module, so every method and its config section are known before
any config is read.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

import semrl.methods
from semrl.errors import ConfigError
from semrl.methods.registry import (
    METHODS,
    POLICY_LOSSES,
    PolicyLoss,
    get_method,
    get_policy_loss,
    register_policy_loss,
)

__all__ = ["METHODS", "POLICY_LOSSES", "get_method", "get_policy_loss", "load_plugins", "tree_methods"]

register_policy_loss(PolicyLoss("ppo", "semrl.methods.policy_loss:ppo"))
for _module in pkgutil.iter_modules(semrl.methods.__path__):
    if _module.ispkg:  # a method's folder; the plain modules are shared tensor code
        importlib.import_module(f"semrl.methods.{_module.name}")


def tree_methods() -> list[str]:
    """The registered methods that sample their own groups (a ``rollout_fn``: ROSE's, TreePO's, FR3E's
    and LATR's trees, and any plug-in's), in registration order."""
    return [name for name, spec in METHODS.items() if spec.rollout_fn is not None]


def load_plugins(plugins: list[str]) -> None:
    """Import each plugin, a ``path/to/file.py`` or an importable ``package.module``, so that the
    methods and losses it registers can be named in the config."""
    for plugin in plugins:
        if plugin.endswith(".py"):
            path = Path(plugin).resolve()
            if not path.is_file():
                raise ConfigError(
                    f"plugin '{plugin}' does not exist; give a .py file or an importable module name"
                )
            name = f"semrl_plugin_{path.stem}"
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            try:
                importlib.import_module(plugin)
            except ModuleNotFoundError as err:
                raise ConfigError(
                    f"plugin '{plugin}' cannot be imported ({err}); give a .py file or a module on sys.path"
                ) from err
