"""Lazy re-exports for a package's ``__init__``: a public name is imported from its module on first use.

A layer's ``__init__`` names what the layer offers without importing it, so importing one module of a
layer (a reader's, say) never pulls in the rest of it (Ray, torch, pandas).

Example:
    >>> import types, sys
    >>> package = types.ModuleType("demo_pkg")
    >>> sys.modules["demo_pkg"] = package
    >>> package.__getattr__, package.__dir__, table = lazy_exports("demo_pkg", {"textwrap": ("dedent",)})
    >>> package.dedent("  x"), table
    ('x', {'dedent': 'textwrap'})
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], dict[str, str]]:
    """``__getattr__`` and ``__dir__`` for ``package``, and its table of each public name to the module defining
    it: ``exports`` maps each module to the names it gives the package."""
    namespace = sys.modules[package].__dict__
    table = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__, table
