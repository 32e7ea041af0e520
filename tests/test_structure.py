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


def _all_imports(name: str, path: Path) -> set[str]:
    """The tunekit modules ``name`` imports anywhere, inside functions too (not for type checking only)."""
    known = {n for n, _ in MODULES}
    found = set()
    tree = ast.parse(path.read_text())
    skipped = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for sub in ast.walk(node)}
    for sub in ast.walk(tree):
        if id(sub) in skipped:
            continue
        if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
            found.add(sub.module)
            found.update(f"{sub.module}.{a.name}" for a in sub.names if f"{sub.module}.{a.name}" in known)
        elif isinstance(sub, ast.Import):
            found.update(a.name for a in sub.names)
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m in known and m != name and m not in parents}


def test_no_import_cycles():
    """No cycle among the library's modules, counting every import: those inside functions too (a cycle hidden
    behind a function-local import is still one module needing the other's layer and the other its)."""
    graph = {name: _all_imports(name, path) for name, path in MODULES}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


#: Functions (docstring included) longer than the 60-line cap that holds everywhere else in the library: each
#: to be split, never one added. (module, function) -> its lines when this list was made.
LONG_FUNCTIONS = {
    ("tunekit/analysis/_status_text.py", "print_snapshot"): 88,
    ("tunekit/analysis/_load.py", "load_results"): 76,
    ("tunekit/cli.py", "_build_parser"): 101,
    ("tunekit/experiment/gc.py", "plan_gc"): 80,
    ("tunekit/multiworker/trial.py", "train_trial"): 94,
    ("tunekit/schedule/pbt.py", "pbt_setup"): 84,
    ("tunekit/analysis/report.py", "_write"): 81,
    ("tunekit/commands/extend.py", "extend_experiment"): 71,
    ("tunekit/commands/resume.py", "_resume_from_record"): 68,
    ("tunekit/experiment/snapshot.py", "_read_experiment"): 111,
    ("tunekit/experiment/verify.py", "verify_experiment"): 81,
}


def test_modules_and_functions_stay_small():
    problems = []
    for _, path in MODULES:
        rel = path.relative_to(ROOT)
        lines = len(path.read_text().splitlines())
        if rel.parts[0] == "tunekit" and lines > 400:
            problems.append(f"{rel}: {lines} lines (at most 400)")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length, allowed = node.end_lineno - node.lineno + 1, LONG_FUNCTIONS.get((rel.as_posix(), node.name), 60)
            if length > allowed:
                problems.append(f"{rel}:{node.lineno} {node.name}(): {length} lines (at most {allowed})")
    assert not problems, "\n".join(problems)


#: Modules no test module imports, each with the test files that exercise it (through the CLI, a Tune run, the
#: docs' snippets or another module). Every other module is imported by a test module of its own.
TESTED_BY = {
    "tunekit._checks": ["tests/tunekit/test_analysis.py", "tests/callbacks/test_policies.py"],
    "tunekit._lazy": ["tests/test_structure.py"],
    "tunekit._ray.output": ["tests/test_cli.py", "tests/tunekit/test_ray_contract.py"],
    "tunekit._ray.pbt": ["tests/tunekit/test_ray_contract.py", "tests/trainables/test_pbt_exploit.py"],
    "tunekit._ray.processes": ["tests/tunekit/test_ray_contract.py", "tests/test_readme.py"],
    "tunekit.analysis._lineage": ["tests/tunekit/test_analysis.py", "tests/trainables/test_pbt_recipe.py"],
    "tunekit.analysis._status_text": ["tests/tunekit/test_snapshot.py", "tests/tunekit/test_readers_truth.py"],
    "tunekit.check": ["tests/test_readme.py"],
    "tunekit.checkpoint._interrupted": ["tests/tunekit/test_verify.py", "tests/tunekit/test_multiworker.py"],
    "tunekit.checkpoint._priority": ["tests/tunekit/test_two_phase.py"],
    "tunekit.checkpoint._ranks": ["tests/tunekit/test_multiworker.py"],
    "tunekit.checkpoint._uploads": ["tests/tunekit/test_gc.py", "tests/tunekit/test_resume.py"],
    "tunekit.commands": ["tests/tunekit/test_resume.py", "tests/tunekit/test_check.py"],
    "tunekit.commands._check_run": ["tests/tunekit/test_check.py"],
    "tunekit.commands._connect": ["tests/test_cli.py", "tests/tunekit/test_cluster.py"],
    "tunekit.commands.extend": ["tests/tunekit/test_resume.py"],
    "tunekit.commands.gc": ["tests/tunekit/test_gc.py", "tests/test_cli.py"],
    "tunekit.commands.quickstart": ["tests/trainables/test_quickstart.py", "tests/test_cli.py"],
    "tunekit.commands.report": ["tests/tunekit/test_report.py", "tests/test_cli.py"],
    "tunekit.commands.status": ["tests/tunekit/test_snapshot.py", "tests/test_cli.py"],
    "tunekit.commands.verify": ["tests/tunekit/test_verify.py", "tests/test_cli.py"],
    "tunekit.commands._recovery": ["tests/tunekit/test_resume_torn.py", "tests/tunekit/test_resume.py"],
    "tunekit.commands.resume": ["tests/tunekit/test_resume.py", "tests/tunekit/test_resume_torn.py"],
    "tunekit.experiment._experiment_state": ["tests/tunekit/test_snapshot.py", "tests/tunekit/test_resume_torn.py"],
    "tunekit.experiment._exploit_log": ["tests/tunekit/test_snapshot.py", "tests/tunekit/test_analysis.py"],
    "tunekit.experiment._lease": ["tests/tunekit/test_resume.py"],
    "tunekit.experiment._listed": ["tests/trainables/test_quickstart.py", "tests/tunekit/test_storage.py"],
    "tunekit.experiment._signals": ["tests/tunekit/test_resume.py", "tests/callbacks/test_preemption.py"],
    "tunekit.experiment._trial_files": ["tests/tunekit/test_index.py", "tests/tunekit/test_snapshot.py"],
    "tunekit.experiment.gc": ["tests/tunekit/test_gc.py"],
    "tunekit.experiment.results": ["tests/tunekit/test_read_model.py", "tests/tunekit/test_analysis.py"],
    "tunekit.experiment.retention": ["tests/tunekit/test_gc.py", "tests/callbacks/test_retention.py"],
    "tunekit.loading": ["tests/test_readme.py"],
    "tunekit.multiworker._lockstep": ["tests/tunekit/test_multiworker.py"],
    "tunekit.pbt": ["tests/test_readme.py", "tests/notebooks/test_notebooks.py"],
    "tunekit.report": ["tests/test_readme.py", "tests/notebooks/test_notebooks.py"],
    "tunekit.schedule": ["tests/tunekit/test_interval.py", "tests/tunekit/test_schedulers.py"],
    "tunekit.schedulers": ["tests/test_readme.py"],
    "tunekit.tensorboard": ["tests/test_readme.py"],
    "tunekit.trial.device": ["tests/tunekit/test_state.py", "tests/trainables/test_reuse.py"],
}


def _imported_by_tests() -> set[str]:
    """The library modules some test module imports: by name, through a package's lazy table, or as the module
    of a name it imports."""
    known, found = {n for n, _ in MODULES}, set()
    for test in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(test.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module in known and node.level == 0:
                module = importlib.import_module(node.module)
                found.add(node.module)
                for alias in node.names:
                    found.add(f"{node.module}.{alias.name}")
                    found.add(getattr(module, "_LAZY", {}).get(alias.name, ""))
                    found.add(getattr(getattr(module, alias.name, None), "__module__", None) or "")
    return found & known


def test_every_module_has_its_tests():
    """A module is imported by a test module, or ``TESTED_BY`` names the existing test files that exercise it; the
    table lists no module a test imports (it shrinks as tests are written)."""
    imported, problems = _imported_by_tests(), []
    for name, _ in MODULES:
        listed = TESTED_BY.get(name)
        if listed is None and name not in imported:
            problems.append(f"{name}: no test module imports it and TESTED_BY does not list it")
        elif listed is not None and name in imported:
            problems.append(f"{name}: a test module imports it; drop it from TESTED_BY")
        elif listed is not None and not all((ROOT / t).is_file() for t in listed):
            problems.append(f"{name}: TESTED_BY names {[t for t in listed if not (ROOT / t).is_file()]}, which do not exist")
    problems += [f"TESTED_BY lists {name}, which is no module" for name in TESTED_BY if name not in dict(MODULES)]
    assert not problems, "\n".join(problems)


#: The library's layers, lowest first. A module imports only from its own layer and those below it (every import,
#: function-local ones included). A module belongs to the longest prefix that names it.
LAYERS = [
    ("base", ["tunekit.errors", "tunekit._env", "tunekit._checks", "tunekit._keys", "tunekit._lazy", "tunekit.table"]),
    ("storage", ["tunekit.storage"]),
    ("checkpoint", ["tunekit.checkpoint"]),
    ("ray", ["tunekit._ray"]),
    ("trial", ["tunekit.trial"]),
    ("experiment", ["tunekit.experiment"]),
    ("schedule", ["tunekit.schedule"]),
    ("analysis", ["tunekit.analysis"]),
    ("frameworks", ["tunekit.integrations", "tunekit.multiworker"]),
    ("commands", ["tunekit.commands"]),
    ("edge", ["tunekit", "tunekit.cli", "tunekit.check", "tunekit.loading", "tunekit.pbt", "tunekit.report",
              "tunekit.schedulers", "tunekit.tensorboard"]),
    ("user", ["tunekit.callbacks", "tunekit.trainables"]),
    ("testing", ["tunekit.testing"]),
]
#: Imports that reach up, each with why.
UPWARD = {("tunekit.commands.quickstart", "tunekit.trainables.quickstart"): "`tunekit quickstart` runs the reference sweep"}


def _layer(module: str) -> int:
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} belongs to no layer of LAYERS"
    return max(matches)[1]


def test_no_module_imports_from_a_higher_layer():
    problems = []
    for name, path in MODULES:
        for imported in sorted(_all_imports(name, path)):
            if _layer(imported) > _layer(name) and (name, imported) not in UPWARD:
                problems.append(f"{name} ({LAYERS[_layer(name)][0]}) imports {imported} ({LAYERS[_layer(imported)][0]})")
    assert not problems, "\n".join(problems)


def test_tunekit_holds_layer_packages_and_the_documented_paths_only():
    """The top of ``tunekit/`` is the layers' packages, the base modules, the CLI's parser and the import paths the
    docs show; a new module goes into its layer's package."""
    top = {p.stem for p in (ROOT / "tunekit").glob("*.py")} - {"__init__"}
    edge = {m.split(".")[1] for m in dict(LAYERS)["edge"] if "." in m}
    base = {m.split(".")[1] for m in dict(LAYERS)["base"]}
    assert top == edge | base
    packages = {p.parent.name for p in (ROOT / "tunekit").glob("*/__init__.py")}
    listed = {m.split(".")[1] for _, prefixes in LAYERS for m in prefixes if m.count(".") == 1}
    assert packages == listed - top - {"callbacks", "trainables"}  # (those two live at the repository's top)


@pytest.mark.parametrize("package", sorted(n for n, p in MODULES if p.name == "__init__.py"
                                           and n.count(".") == 1 and n.startswith("tunekit.")))
def test_each_package_says_what_it_owns_and_may_import(package):
    doc = importlib.import_module(package).__doc__ or ""
    assert len(doc.split()) >= 20, f"{package}: its docstring does not say what the layer owns"
    if package not in ("tunekit.callbacks", "tunekit.trainables", "tunekit.testing", "tunekit._ray",
                       "tunekit.integrations", "tunekit.multiworker"):
        assert "May import" in doc, f"{package}: its docstring does not say what it may import"


@pytest.mark.parametrize("package", sorted(n for n, p in MODULES if p.name == "__init__.py"))
def test_a_packages_lazy_table_is_its_public_names(package):
    module = importlib.import_module(package)
    table = getattr(module, "_LAZY", None)
    if table is None:
        return
    assert set(module.__all__) - {"__version__"} == set(table)
    assert all(getattr(importlib.import_module(target), name) is getattr(module, name) for name, target in table.items())


def test_every_package_is_installed():
    """setup.cfg lists every package of the library: one it leaves out works in this editable checkout and is
    missing from a wheel."""
    listed = re.search(r"^packages =\n((?:    .+\n)+)", (ROOT / "setup.cfg").read_text(), flags=re.M).group(1).split()
    found = {name for name, path in MODULES if path.name == "__init__.py"}
    assert sorted(found) == sorted(listed)


#: Module-level state a module changes, each with why it belongs to the process, not to an object.
MODULE_STATE = {
    ("tunekit.trial.function", "_RUNNING"): "the function trainable each training function runs in, by trial id",
    ("tunekit.trial.reuse", "_slots"): "objects kept across the trials one worker process runs (reusable())",
    ("tunekit.multiworker._lockstep", "_LIVE"): "each trial's Train run, owned by its trainable, by trial id",
    ("tunekit.multiworker.session", "_CURRENT"): "the one WorkerSession of a Train worker process",
    ("tunekit.multiworker._parts", "_STAGES_AGAIN"): "a fact about the installed torch, found once",
    ("tunekit.integrations.lightning", "_CALLBACKS"): "Lightning callback classes made once per process",
    ("tunekit.integrations.transformers", "_CALLBACKS"): "Trainer callback classes made once per process",
    ("tunekit.callbacks.record", "_INDEX_CHECKED"): "trials whose index this driver compared once",
    ("tunekit.callbacks.record", "_INDEXING"): "the readers' index refresh of each remote experiment, in flight or last",
    ("tunekit.experiment.record", "_RUNS"): "the driver's runs being recorded, by their trial list",
    ("tunekit.checkpoint._announced", "_REGISTERED_UNWRITTEN"): "unwritten checkpoints this process was asked for",
    ("tunekit.trial._restoring", "_FOREIGN_NOTED"): "foreign checkpoints this process has warned about once",
}
_MUTATORS = {"add", "append", "appendleft", "clear", "discard", "extend", "pop", "popitem", "popleft", "remove",
             "setdefault", "update"}


def _mutated_module_state(path: Path) -> set[str]:
    """Names bound at ``path``'s top to a dict, list, set or deque that the module changes."""
    tree = ast.parse(path.read_text())
    bound = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                isinstance(value, ast.Call) and getattr(value.func, "attr", getattr(value.func, "id", None))
                in ("dict", "list", "set", "deque", "defaultdict", "OrderedDict")):
            bound |= {t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"}
    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and isinstance(node.value, ast.Name):
            changed.add(node.value.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS \
                and isinstance(node.func.value, ast.Name):
            changed.add(node.func.value.id)
    return bound & changed


def test_no_module_changes_state_of_its_own_but_the_named_ones():
    """State a module keeps at its top and changes belongs to an object (a trial's run, a callback), unless it
    is the process's by nature: those are named in MODULE_STATE, with why."""
    found = sorted(f"{name}.{var}" for name, path in MODULES for var in _mutated_module_state(path)
                   if (name, var) not in MODULE_STATE)
    assert not found, f"module-level state a module changes (own it by an object, or name it in MODULE_STATE): {found}"
