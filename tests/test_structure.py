"""The package's tiers and boundaries: public names, private imports, environment variables, doctests."""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import tunekit

ROOT = Path(__file__).resolve().parents[1]
#: Package directory -> the dotted package it installs as (setup.cfg's package_dir).
PACKAGES = {"tunekit": "tunekit", "trainables": "tunekit.trainables", "callbacks": "tunekit.callbacks"}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for directory, package in PACKAGES.items():
        for path in sorted((ROOT / directory).rglob("*.py")):
            rel = path.relative_to(ROOT / directory).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([package, *parts]), path))
    return out


MODULES = _modules()


def test_no_module_imports_another_modules_private_names():
    """Implementation modules are underscore-prefixed; their names are public to the package. Only
    ``tunekit._ray`` (the guarded door to Ray's internals) is exempt, as are a module's own names."""
    offenders = []
    for name, path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tunekit"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                           and not importlib.util.find_spec(f"{node.module}.{a.name}")]  # a private module: fine
                if private and node.module != name:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {private} from {node.module}")
    assert not offenders, "\n".join(offenders)


def test_every_module_lists_its_public_names_sorted_and_complete():
    problems = []
    for name, path in MODULES:
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        names = getattr(module, "__all__", None)
        if names is None:
            problems.append(f"{name}: no __all__")
            continue
        missing = [n for n in names if not hasattr(module, n)]
        if missing:
            problems.append(f"{name}: __all__ names {missing}, which it lacks")
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                   and not n.name.startswith("_")}
        if not name.endswith("__init__") and not path.name == "__init__.py":
            unlisted = sorted(defined - set(names))
            if unlisted:
                problems.append(f"{name}: public but not in __all__: {unlisted}")
        if list(names) != sorted(names):
            problems.append(f"{name}: __all__ is not sorted")
    assert not problems, "\n".join(problems)


def test_tunekit_all_is_the_lazy_table():
    assert set(tunekit.__all__) == set(tunekit._LAZY) | {"__version__"}
    assert all(getattr(importlib.import_module(module), n) is getattr(tunekit, n) for n, module in tunekit._LAZY.items())


def test_environment_variables_are_read_only_through_the_registry_and_documented():
    from tunekit import _env

    docs = (ROOT / "docs" / "environment.md").read_text()
    assert all(f"`{name}`" in docs for name in _env.ENV_VARS), "docs/environment.md lacks a registered variable"
    readers = []
    for _, path in MODULES:
        if path.name == "_env.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"environ(\.get)?\s*[\[(]\s*[\"']TUNEKIT_", line) or re.search(r"getenv\([\"']TUNEKIT_", line):
                readers.append(f"{path.relative_to(ROOT)}:{lineno}")
    assert not readers, f"TUNEKIT_* read outside tunekit._env: {readers}"
    with pytest.raises(tunekit.ConfigError, match=r"TUNEKIT_CHECKPOINT_WAIT_S='soon': expected a number of seconds"):
        _env.get_float("TUNEKIT_CHECKPOINT_WAIT_S", environ={"TUNEKIT_CHECKPOINT_WAIT_S": "soon"})
    assert _env.get_flag("TUNEKIT_BACKGROUND_SAVES", environ={"TUNEKIT_BACKGROUND_SAVES": "Off"}) is False


def test_errors_are_one_hierarchy():
    from tunekit.checkpoint import UnsupportedManifest

    assert issubclass(UnsupportedManifest, tunekit.TunekitError) and issubclass(UnsupportedManifest, ValueError)


#: Modules whose docstring examples need a running Ray or write outside a temporary directory.
_NO_DOCTEST: set[str] = set()


@pytest.mark.parametrize("name", [n for n, p in MODULES if ">>>" in p.read_text() and n not in _NO_DOCTEST])
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (run python -m doctest -v)"
