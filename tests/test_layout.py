"""The package's architecture rules, checked over its source (fast, no database).

Each rule is a function over a source tree that returns its offenders as
``path:line: what`` strings, so a failure names every offender at once; the
self-tests at the end run each rule on a small synthetic tree, once obeying it and
once breaking it. The rules (issue 19):

- :func:`long_modules`: no module over :data:`MAX_MODULE_LINES` lines (migrations
  aside), except the data-like or generated ones in :data:`LARGE_MODULES`, each with
  its reason;
- :func:`long_functions`: no function over :data:`MAX_FUNCTION_LINES` lines (from its
  ``def`` to its last line) unless its docstring has a line starting with
  :data:`LONG_MARKER` that says why;
- :func:`import_cycles`: no cycle among the package's modules, counting the imports
  that run when a module is imported (module level, class bodies, ``try``/``if``
  blocks; not ``if TYPE_CHECKING:`` blocks, not function bodies);
- :func:`function_imports`: no import of a package module inside a function, except
  those in :data:`FUNCTION_IMPORTS`, each with its reason;
- :func:`init_offenders`: a package's ``__init__.py`` re-exports and holds nothing
  else: its statements are a docstring, imports, ``if TYPE_CHECKING:`` blocks of
  imports, assignments of constants to dunder names (``__all__``, ``__version__``)
  and aliases (``name = other`` or ``name = module.attribute``);
- :func:`import_side_effects`: importing any module of the package, in a fresh
  interpreter after ``django.setup()``, registers nothing (handlers, declared jobs,
  observers, signal receivers, system checks, admin models), runs no SQL and starts
  no thread, except the modules in :data:`DECLARING_MODULES`. What
  ``AppConfig.ready()`` imports has run by then: a module it imports may register
  at import (Django's idiom for receivers), any other may not.

:func:`import_cycles` and :func:`function_imports` work together: a cycle hidden by
moving one of its imports into a function is a function-level import.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import django_tasks_coord

PACKAGE_ROOT = Path(django_tasks_coord.__file__).resolve().parent
ROOT = PACKAGE_ROOT.parent

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
#: A docstring line starting with this says why its function is long.
LONG_MARKER = "Long because:"

#: Modules allowed over MAX_MODULE_LINES (path relative to the package), with the reason:
#: generated or data-like modules only. None today (api/openapi.py was mostly literal
#: data; its bodies' schemas became api/schemas.py instead of an entry here).
LARGE_MODULES: dict[str, str] = {}

#: Function-level imports of package modules allowed, as "path:qualname", with the reason.
FUNCTION_IMPORTS: dict[str, str] = {
    "apps.py:TasksCoordConfig.ready": (
        "Django imports apps.py before the app registry is ready, so the modules that "
        "use models (receivers, checks) can only be imported in AppConfig.ready()"
    ),
    "api/asgi.py:_views": (
        "a project's asgi.py imports serve_api (or serve_long_polls) before "
        "get_asgi_application() sets Django up (docs/executors.md); the views it hands the "
        "API's calls to use models"
    ),
    "management/commands/runscheduler.py:Command._metrics_server": (
        "metrics.node needs the optional [metrics] extra (prometheus_client) and refuses to "
        "import without it; only --metrics-port / METRICS_PORT asks for it"
    ),
}

#: Modules whose import is meant to register things: the app's own declaring modules,
#: which ``runscheduler`` autodiscovers like every installed app's (checks.DECLARING_MODULES).
DECLARING_MODULES: dict[str, str] = {
    "consumers": (
        "the app's consumers module: runscheduler imports every app's consumers module to "
        "register its consumers; this one makes the node process the django.tasks queues"
    ),
}


@dataclass(frozen=True)
class Module:
    """One source file of the package."""

    path: Path  # relative to the directory that holds the package
    name: str  # dotted
    tree: ast.Module
    lines: int

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def modules(package_root: Path) -> list[Module]:
    """Every module of the package at ``package_root`` (migrations aside), sorted by path."""
    found = []
    for path in sorted(package_root.rglob("*.py")):
        relative = path.relative_to(package_root.parent)
        if "migrations" in relative.parts:
            continue
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        found.append(Module(relative, ".".join(parts), tree, len(text.splitlines())))
    return found


def _inner(module: Module) -> str:
    """The module's path relative to its package (the key of the allowlists)."""
    return Path(*module.path.parts[1:]).as_posix()


# --- (a) module size ---------------------------------------------------------------------


def long_modules(package_root: Path, allowed: dict[str, str]) -> list[str]:
    """Modules over MAX_MODULE_LINES lines that ``allowed`` does not name."""
    return [
        f"{module.path}:1: {module.lines} lines (more than {MAX_MODULE_LINES})"
        for module in modules(package_root)
        if module.lines > MAX_MODULE_LINES and _inner(module) not in allowed
    ]


# --- (b) function size -------------------------------------------------------------------


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function in ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _says_why(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    docstring = ast.get_docstring(function) or ""
    return any(line.strip().startswith(LONG_MARKER) for line in docstring.splitlines())


def long_functions(package_root: Path) -> list[str]:
    """Functions over MAX_FUNCTION_LINES lines whose docstring does not say why."""
    offenders = []
    for module in modules(package_root):
        for qualname, node in _functions(module.tree):
            assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES and not _says_why(node):
                offenders.append(
                    f"{module.path}:{node.lineno}: {qualname} is {length} lines "
                    f"(more than {MAX_FUNCTION_LINES}, and no {LONG_MARKER!r} in its docstring)"
                )
    return offenders


# --- imports -----------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    node: ast.AST, *, in_function: bool = False, scope: str = ""
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, str]]:
    """(import, whether it is inside a function, enclosing qualname) under ``node``.

    Imports in the body of an ``if TYPE_CHECKING:`` never run and are left out.
    """
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function, scope
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.orelse:
                yield from _imports(
                    ast.Module(body=[statement], type_ignores=[]),
                    in_function=in_function,
                    scope=scope,
                )
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            name = getattr(child, "name", "<lambda>")
            yield from _imports(child, in_function=True, scope=f"{scope}{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _imports(child, in_function=in_function, scope=f"{scope}{child.name}.")
        else:
            yield from _imports(child, in_function=in_function, scope=scope)


def _targets(
    module: Module, statement: ast.Import | ast.ImportFrom, known: set[str], package: str
) -> list[str]:
    """The package modules ``statement`` (in ``module``) explicitly imports."""
    if isinstance(statement, ast.Import):
        names = [alias.name for alias in statement.names]
        return [name for name in names if name in known]
    if statement.level:
        base_parts = module.name.split(".")
        if not module.is_package:
            base_parts.pop()
        base_parts = base_parts[: len(base_parts) - (statement.level - 1)]
        base = ".".join(base_parts + ([statement.module] if statement.module else []))
    else:
        base = statement.module or ""
    if base != package and not base.startswith(package + "."):
        return []
    found = []
    for alias in statement.names:
        submodule = f"{base}.{alias.name}"
        if submodule in known:
            found.append(submodule)
        elif base in known:
            found.append(base)
    return sorted(set(found))


def import_graph(package_root: Path) -> dict[str, dict[str, str]]:
    """{module: {imported module: "path:line"}} of the imports that run at import time."""
    found = modules(package_root)
    known = {module.name for module in found}
    package = package_root.name
    graph: dict[str, dict[str, str]] = {module.name: {} for module in found}
    for module in found:
        for statement, in_function, _ in _imports(module.tree):
            if in_function:
                continue
            for target in _targets(module, statement, known, package):
                graph[module.name].setdefault(target, f"{module.path}:{statement.lineno}")
    return graph


def _cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold a cycle (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, {}):
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def import_cycles(package_root: Path) -> list[str]:
    """Every import that closes a cycle: the edges inside each cycle, with file:line."""
    graph = import_graph(package_root)
    offenders = []
    for component in _cycles(graph):
        members = set(component)
        cycle = " <-> ".join(component)
        for source in component:
            for target, where in sorted(graph[source].items()):
                if target in members:
                    offenders.append(f"{where}: {source} imports {target} (cycle: {cycle})")
    return offenders


def function_imports(package_root: Path, allowed: dict[str, str]) -> list[str]:
    """Imports of package modules inside functions that ``allowed`` does not name."""
    package = package_root.name
    found = modules(package_root)
    known = {module.name for module in found}
    offenders = []
    for module in found:
        for statement, in_function, scope in _imports(module.tree):
            if not in_function or f"{_inner(module)}:{scope.rstrip('.')}" in allowed:
                continue
            targets = _targets(module, statement, known, package)
            if targets:
                offenders.append(
                    f"{module.path}:{statement.lineno}: {scope.rstrip('.')} imports "
                    f"{', '.join(targets)} inside a function"
                )
    return offenders


# --- (e) __init__.py only re-exports -----------------------------------------------------


def _is_constant(value: ast.expr) -> bool:
    if isinstance(value, ast.List | ast.Tuple | ast.Set):
        return all(_is_constant(element) for element in value.elts)
    return isinstance(value, ast.Constant)


def _is_alias(value: ast.expr) -> bool:
    while isinstance(value, ast.Attribute):
        value = value.value
    return isinstance(value, ast.Name)


def _re_exports(statement: ast.stmt, first: bool) -> bool:
    """Whether ``statement`` may stand in an ``__init__.py`` (see the module docstring)."""
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return True
    if first and isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return isinstance(statement.value.value, str)  # the docstring
    if isinstance(statement, ast.If) and _is_type_checking(statement.test):
        return not statement.orelse and all(
            isinstance(inner, ast.Import | ast.ImportFrom) for inner in statement.body
        )
    if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        if not all(isinstance(target, ast.Name) for target in targets):
            return False
        names = [target.id for target in targets if isinstance(target, ast.Name)]
        dunder = all(name.startswith("__") and name.endswith("__") for name in names)
        return (dunder and _is_constant(statement.value)) or _is_alias(statement.value)
    return False


def init_offenders(package_root: Path) -> list[str]:
    """Statements of ``__init__.py`` files that do more than re-export."""
    offenders = []
    for module in modules(package_root):
        if not module.is_package:
            continue
        for position, statement in enumerate(module.tree.body):
            if not _re_exports(statement, first=position == 0):
                what = type(statement).__name__
                name = getattr(statement, "name", None)
                offenders.append(
                    f"{module.path}:{statement.lineno}: {what}{f' {name}' if name else ''} "
                    f"in a package's __init__.py (it should only re-export)"
                )
    return offenders


# --- (f) import side effects -------------------------------------------------------------

_PROBE = r"""
import gc, importlib, json, sys, threading, weakref
import django
django.setup()
from django.contrib import admin
from django.core.checks.registry import registry as checks
from django.db import connections
from django.dispatch import Signal

modules = json.loads(sys.argv[1])
executed = []

def record_sql(execute, sql, params, many, context):
    executed.append(sql)
    return execute(sql, params, many, context)

def ours(function):
    function = function() if isinstance(function, weakref.ReferenceType) else function
    module = getattr(function, "__module__", None) or ""
    return module == "{package}" or module.startswith("{package}.")

def snapshot():
    state = {
        "signal receivers": sorted(
            f"{id(signal)}:{receiver[0]}"
            for signal in gc.get_objects() if isinstance(signal, Signal)
            for receiver in signal.receivers if ours(receiver[1])
        ),
        "system checks": sorted(
            repr(check) for check in checks.get_checks(include_deployment_checks=True)
            if ours(check)
        ),
        "admin models": sorted(model._meta.label for model in admin.site._registry),
        "threads": sorted(thread.name for thread in threading.enumerate()),
    }
    handlers = sys.modules.get("{package}.handlers")
    if handlers is not None:
        registry = handlers.registry
        state["handlers"] = sorted(
            repr(item) for item in (registry._consumers, registry._named, registry._declared)
        )
    declared = sys.modules.get("{package}.scheduling.declared")
    if declared is not None:
        state["declared jobs"] = sorted(declared._declarations)
    observers = sys.modules.get("{package}.observers")
    if observers is not None:
        state["observers"] = [repr(observer) for observer in observers._observers]
    return state

report = {"changed": {}, "skipped": {}, "failed": {}}
for name in modules:
    if name in sys.modules:
        continue
    before = snapshot()
    executed.clear()
    wrappers = [connections[alias].execute_wrapper(record_sql) for alias in connections]
    for wrapper in wrappers:
        wrapper.__enter__()
    try:
        importlib.import_module(name)
    except ImportError as exc:
        if exc.name and not exc.name.startswith("{package}"):
            report["skipped"][name] = str(exc)
        else:
            report["failed"][name] = repr(exc)
        continue
    except Exception as exc:
        report["failed"][name] = repr(exc)
        continue
    finally:
        for wrapper in reversed(wrappers):
            wrapper.__exit__(None, None, None)
    after = snapshot()
    changes = [key for key in after if before.get(key, after[key]) != after[key]]
    if executed:
        changes.append(f"SQL: {executed[0][:80]}")
    if changes:
        report["changed"][name] = changes
print(json.dumps(report))
"""


def import_side_effects(
    package_root: Path, settings_module: str, allowed: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """(offenders, modules skipped for a missing optional dependency).

    Imports every module of the package but those ``allowed`` names, one after another
    in one fresh interpreter after ``django.setup()``, and compares the registries
    before and after each. A change is blamed on the module whose import (with what it
    imports) caused it; only receivers and checks defined in the package count.
    """
    package = package_root.name
    found = {module.name: module for module in modules(package_root)}
    names = [name for name in sorted(found) if name.removeprefix(package + ".") not in allowed]
    environment = dict(os.environ, DJANGO_SETTINGS_MODULE=settings_module)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(package_root.parent), str(ROOT), environment.get("PYTHONPATH", "")]
    )
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("{package}", package), json.dumps(names)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=package_root.parent,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout.splitlines()[-1])
    offenders = [
        f"{found[name].path}:1: importing {name} raised {error}"
        for name, error in report["failed"].items()
    ]
    offenders += [
        f"{found[name].path}:1: importing {name} changed {', '.join(changes)}"
        for name, changes in report["changed"].items()
    ]
    return offenders, report["skipped"]


# --- the rules, on the package -----------------------------------------------------------


def _fail(offenders: list[str], rule: str) -> None:
    if offenders:
        pytest.fail(f"{rule}:\n" + "\n".join(offenders), pytrace=False)


def test_no_module_is_too_long() -> None:
    _fail(long_modules(PACKAGE_ROOT, LARGE_MODULES), "Modules too long")


def test_no_function_is_too_long_without_a_reason() -> None:
    _fail(long_functions(PACKAGE_ROOT), "Functions too long")


def test_no_import_cycles() -> None:
    _fail(import_cycles(PACKAGE_ROOT), "Import cycles")


def test_no_function_level_imports_of_the_package() -> None:
    _fail(function_imports(PACKAGE_ROOT, FUNCTION_IMPORTS), "Function-level imports")


def test_package_inits_only_re_export() -> None:
    _fail(init_offenders(PACKAGE_ROOT), "__init__.py holding implementation")


def test_importing_a_module_has_no_side_effects() -> None:
    offenders, _skipped = import_side_effects(PACKAGE_ROOT, "tests.settings", DECLARING_MODULES)
    _fail(offenders, "Import side effects")


def test_the_allowlists_name_what_exists() -> None:
    """An allowlist entry for a module or function that no longer exists goes too."""
    found = {_inner(module): module for module in modules(PACKAGE_ROOT)}
    assert set(LARGE_MODULES) <= set(found)
    for key in FUNCTION_IMPORTS:
        path, qualname = key.split(":")
        assert qualname in {name for name, _ in _functions(found[path].tree)}, key
    names = {module.name.removeprefix("django_tasks_coord.") for module in found.values()}
    assert set(DECLARING_MODULES) <= names
    reasons = [*LARGE_MODULES.values(), *FUNCTION_IMPORTS.values(), *DECLARING_MODULES.values()]
    assert all(reason.strip() for reason in reasons)


# --- the rules, shown to fail when broken (a synthetic package in tmp_path) --------------


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` ({relative path: source}) under ``root``; return the package dir."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return root / next(iter(files)).split("/")[0]


def _function(name: str, body_lines: int, docstring: str = "") -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    doc = f'    """{docstring}"""\n' if docstring else ""
    return f"def {name}():\n{doc}{body}"


def test_long_modules_fails_on_a_long_module_unless_allowed(tmp_path: Path) -> None:
    package = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/short.py": "x = 1\n" * MAX_MODULE_LINES,
            "pkg/long.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
            "pkg/sub/data.py": "x = 1\n" * 1000,
            "pkg/migrations/0001_initial.py": "x = 1\n" * 1000,
        },
    )
    assert long_modules(package, {"sub/data.py": "a table"}) == [
        f"pkg/long.py:1: {MAX_MODULE_LINES + 1} lines (more than {MAX_MODULE_LINES})"
    ]
    assert len(long_modules(package, {})) == 2


def test_long_functions_fails_on_a_long_function_without_a_reason(tmp_path: Path) -> None:
    fits = MAX_FUNCTION_LINES - 1  # the def line counts
    reason = f"Do it.\n\n    {LONG_MARKER} one table, row by row.\n    "
    package = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": _function("fits", fits)
            + _function("too_long", fits + 1)
            + _function("says_why", fits + 10, reason)
            + "class C:\n"
            + textwrap.indent(
                _function("method", fits + 1, "Mentions Long because: mid-line"), "    "
            ),
        },
    )
    offenders = long_functions(package)
    assert [offender.split(" is ")[0].split(": ")[1] for offender in offenders] == [
        "too_long",
        "C.method",
    ], offenders
    assert offenders[0] == (
        f"pkg/a.py:{MAX_FUNCTION_LINES + 1}: too_long is {MAX_FUNCTION_LINES + 1} lines "
        f"(more than {MAX_FUNCTION_LINES}, and no {LONG_MARKER!r} in its docstring)"
    )


def test_import_cycles_fails_on_a_cycle(tmp_path: Path) -> None:
    package = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "from . import c\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from pkg.a import x\n",  # into the cycle, not part of it
            "pkg/e.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from pkg import f
                def later():
                    from pkg import f
            """,
            "pkg/f.py": "from pkg import e\n",
            "pkg/sub/__init__.py": "from pkg.sub.g import y\n",
            "pkg/sub/g.py": "from pkg.sub import h\n",  # a sibling module: no cycle
            "pkg/sub/h.py": "class C:\n    from ..sub import g\n",  # class bodies run: a cycle
        },
    )
    assert import_cycles(package) == [
        "pkg/a.py:1: pkg.a imports pkg.b (cycle: pkg.a <-> pkg.b <-> pkg.c)",
        "pkg/b.py:1: pkg.b imports pkg.c (cycle: pkg.a <-> pkg.b <-> pkg.c)",
        "pkg/c.py:1: pkg.c imports pkg.a (cycle: pkg.a <-> pkg.b <-> pkg.c)",
        "pkg/sub/g.py:1: pkg.sub.g imports pkg.sub.h (cycle: pkg.sub.g <-> pkg.sub.h)",
        "pkg/sub/h.py:2: pkg.sub.h imports pkg.sub.g (cycle: pkg.sub.g <-> pkg.sub.h)",
    ]
    (package / "sub" / "h.py").write_text("from pkg.sub import y\n")  # the __init__'s name
    assert [offender.split(" (")[0] for offender in import_cycles(package)[3:]] == [
        "pkg/sub/__init__.py:1: pkg.sub imports pkg.sub.g",
        "pkg/sub/g.py:1: pkg.sub.g imports pkg.sub.h",
        "pkg/sub/h.py:1: pkg.sub.h imports pkg.sub",
    ]


def test_function_imports_fails_on_an_import_of_the_package_in_a_function(
    tmp_path: Path,
) -> None:
    package = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": """\
                import json
                def fine():
                    import decimal
                class C:
                    def method(self):
                        from pkg import b
                        from . import c
                def allowed():
                    from pkg.b import x
                def outer():
                    def inner():
                        import pkg.b
            """,
            "pkg/b.py": "",
            "pkg/c.py": "",
        },
    )
    assert function_imports(package, {"a.py:allowed": "a reason"}) == [
        "pkg/a.py:6: C.method imports pkg.b inside a function",
        "pkg/a.py:7: C.method imports pkg.c inside a function",
        "pkg/a.py:12: outer.inner imports pkg.b inside a function",
    ]
    assert len(function_imports(package, {})) == 4


def test_init_offenders_fails_on_an_init_that_implements(tmp_path: Path) -> None:
    package = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": '''\
                """Docs."""
                from __future__ import annotations
                from typing import TYPE_CHECKING
                from pkg.a import thing
                if TYPE_CHECKING:
                    from pkg.a import Other
                __version__ = "1.0"
                __all__ = ["thing", "alias"]
                alias = thing
                nested = thing.attribute
            ''',
            "pkg/a.py": "def helper():\n    pass\n",
            "pkg/sub/__init__.py": """\
                from pkg.a import helper
                LIMIT = 3
                def implemented():
                    return helper()
                class Implemented:
                    pass
                helper()
            """,
        },
    )
    assert init_offenders(package) == [
        "pkg/sub/__init__.py:2: Assign in a package's __init__.py (it should only re-export)",
        "pkg/sub/__init__.py:3: FunctionDef implemented in a package's __init__.py "
        "(it should only re-export)",
        "pkg/sub/__init__.py:5: ClassDef Implemented in a package's __init__.py "
        "(it should only re-export)",
        "pkg/sub/__init__.py:7: Expr in a package's __init__.py (it should only re-export)",
    ]


def test_import_side_effects_fails_on_a_module_that_registers(tmp_path: Path) -> None:
    package = write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/settings.py": """\
                SECRET_KEY = "x"
                INSTALLED_APPS = ["django.contrib.admin", "django.contrib.auth",
                    "django.contrib.contenttypes", "django.contrib.messages",
                    "django.contrib.sessions"]
                DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                    "NAME": ":memory:"}}
            """,
            "pkg/quiet.py": "from django.dispatch import Signal\nlater = Signal()\n",
            "pkg/receives.py": """\
                from django.core.signals import request_started
                def receiver(**kwargs):
                    pass
                request_started.connect(receiver)
            """,
            "pkg/checks.py": """\
                from django.core import checks
                @checks.register
                def check(**kwargs):
                    return []
            """,
            "pkg/queries.py": """\
                from django.db import connection
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            """,
            "pkg/threads.py": """\
                import threading, time
                threading.Thread(target=time.sleep, args=(5,), daemon=True, name="x").start()
            """,
            "pkg/declaring.py": "from pkg import receives\n",
            "pkg/optional.py": "import not_installed_anywhere\n",
        },
    )
    offenders, skipped = import_side_effects(package, "pkg.settings", {"declaring": "on purpose"})
    assert offenders == [
        "pkg/checks.py:1: importing pkg.checks changed system checks",
        "pkg/queries.py:1: importing pkg.queries changed SQL: SELECT 1",
        "pkg/receives.py:1: importing pkg.receives changed signal receivers",
        "pkg/threads.py:1: importing pkg.threads changed threads",
    ]
    assert set(skipped) == {"pkg.optional"}
