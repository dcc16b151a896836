"""Dependencies point one way: workflows <- activities <- worker, and workflows <- fixture <- worker.

Read from the source with ``ast`` (every ``import`` and ``from ... import``, including the ones
inside functions), so a lazy import cannot hide a cycle. Within ``workflows/``, activities use
only the pure modules (rules, records, names): never one that imports temporalio or defines a
``@workflow.defn`` class, so the I/O layer does not load workflow code.

``worker/`` is rooms (``cli/``, ``ingress/``, ``serve/``, ...), not files: a room's ``__init__`` names
(``__all__``) the modules other rooms may import, and no import across rooms reaches another. No
module of the product holds an SQL string outside ``activities/ledger/``, and nothing in the tree
imports a bare top-level package that only exists in a checkout (``worker.x``: the wheel has
``mcpsync.worker.x`` only).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "workflows": ("activities", "worker", "fixture", "benchmarks", "sim"),  # deterministic: no I/O above it
    "activities": ("worker", "fixture", "benchmarks", "sim"),  # all I/O, driven by the worker
    "worker": ("sim",),  # the simulator is a development tool of the source tree (the CLI loads it by name)
    "sim": ("activities", "worker", "fixture", "benchmarks"),  # pure: it interprets the workflows' program
    # The demo and test MCP server: a server of its own, not a process of the product. It shares the
    # catalog rules (workflows/) with the reconciler that checks it; `mcpsync up` (worker/) starts it.
    "fixture": ("activities", "worker", "benchmarks", "sim"),
}
# The simulator steps the session queue's read and start cycles as production's activity code
# (``sim/cycles.py``: ``McpSessionActivities`` over its own server and ledger), and the ingress's sweep as
# production's ``Resync.look`` over its ledger's ``due`` (``sim/ingress.py``: the ``Due`` answer it
# models); nothing else of the I/O layer.
ALLOWED = {"sim": ("mcpsync.activities.mcp_session", "mcpsync.activities.ledger",
                   "mcpsync.activities.ledger.content", "mcpsync.activities.ledger.verification",
                   "mcpsync.worker.ingress.resync")}



@functools.cache
def _parsed(path: Path, stamp: tuple[int, int]) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _tree(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per version of the file (every check walks the same trees)."""
    st = path.stat()
    return _parsed(path, (st.st_mtime_ns, st.st_size))


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package: str) -> None:
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in sorted((ROOT / package).rglob("*.py"))
           for line, name in _imports(path)
           if _layer(name) in FORBIDDEN[package] and name not in ALLOWED.get(package, ())]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def _layer(module: str) -> str:
    """The folder an import names: ``mcpsync.worker.observe.metrics`` (installed name) -> ``worker``."""
    return module.removeprefix("mcpsync.").split(".")[0]


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from mcpsync.worker.main.services import start_subscription\n")
    assert _imports(probe) == [(2, "mcpsync.worker.main.services")]
    assert [_layer(name) for _, name in _imports(probe)] == ["worker"]  # the folder, with or without mcpsync.


def _workflows_imported(path: Path) -> list[tuple[int, Path]]:
    """The ``workflows/`` source files an import names (``from mcpsync.workflows import x`` too)."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            modules = [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [(node.lineno, node.module)]
            if node.module.removeprefix("mcpsync.") == "workflows":
                modules += [(node.lineno, f"workflows.{alias.name}") for alias in node.names]
        else:
            continue
        for line, name in modules:
            parts = name.removeprefix("mcpsync.").split(".")
            if parts[0] != "workflows" or len(parts) < 2:
                continue
            if (ROOT / "workflows" / f"{parts[1]}.py").exists():
                found.append((line, ROOT / "workflows" / f"{parts[1]}.py"))
            elif (ROOT / "workflows" / parts[1]).is_dir():  # a package (records): every module of it
                found += [(line, module) for module in sorted((ROOT / "workflows" / parts[1]).glob("*.py"))]
    return found


def _is_workflow_code(path: Path) -> str | None:
    """Why a workflows module is Temporal code (imports temporalio, defines a workflow), else None."""
    tree = _tree(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if isinstance(target, ast.Attribute) and target.attr == "defn" and \
                        isinstance(target.value, ast.Name) and target.value.id == "workflow":
                    return f"defines @workflow.defn {node.name}"
    for line, name in _imports(path):
        if name.split(".")[0] == "temporalio":
            return f"imports {name} (line {line})"
    return None


def test_activities_import_only_pure_workflows_modules() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line}: {target.relative_to(ROOT)} {why}"
           for path in sorted((ROOT / "activities").rglob("*.py"))
           for line, target in _workflows_imported(path)
           if (why := _is_workflow_code(target)) is not None]
    assert not bad, "activities import workflow code:\n" + "\n".join(bad)


def test_the_workflow_code_check_sees_both_kinds(tmp_path: Path) -> None:
    assert _is_workflow_code(ROOT / "workflows" / "catalog.py") is not None  # the CatalogWorkflow
    assert _is_workflow_code(ROOT / "workflows" / "catalog_rules.py") is None
    assert _is_workflow_code(ROOT / "workflows" / "answer_rules.py") is None
    defn = tmp_path / "defn.py"
    defn.write_text("from x import workflow\n\n@workflow.defn(name='W')\nclass W:\n    pass\n")
    assert _is_workflow_code(defn) == "defines @workflow.defn W"
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    import temporalio.workflow\n")
    assert _is_workflow_code(lazy) == "imports temporalio.workflow (line 2)"
    probe = tmp_path / "probe.py"
    probe.write_text("from mcpsync.workflows import catalog\nimport mcpsync.workflows.answer_rules\n")
    assert [(line, target.name) for line, target in _workflows_imported(probe)] == [
        (1, "catalog.py"), (2, "answer_rules.py")]
    package = tmp_path / "package.py"
    package.write_text("from mcpsync.workflows.records.ledger import FenceSnapshot\n")
    assert (1, ROOT / "workflows" / "records" / "ledger.py") in _workflows_imported(package)


# What workflows/ may import, by module: the main worker may run it without the SDK sandbox's checks
# ([temporal] workflow_runner = "unsandboxed"), so no module that reaches the clock, randomness, threads,
# files or the network may be imported there. Replay in the SDK's strict sandbox (test_replay.py) checks
# the calls the recorded runs make; this checks every line.
WORKFLOW_IMPORTS = {"__future__", "asyncio", "collections", "collections.abc", "dataclasses", "datetime",
                    "functools", "enum", "hashlib", "hmac", "json", "pydantic", "re", "typing",
                    "urllib.parse", "temporalio", "temporalio.common", "temporalio.exceptions",
                    "temporalio.workflow"}
WALL_CLOCK = {"now", "utcnow", "today", "fromtimestamp"}  # datetime/date class methods that read the clock


def _nondeterministic(path: Path) -> list[str]:
    """Imports outside ``WORKFLOW_IMPORTS`` (mcpsync's own aside) and ``datetime.now()``-like clock reads."""
    bad = [f"{line}: import {name}" for line, name in _imports(path)
           if name.split(".")[0] != "mcpsync" and name not in WORKFLOW_IMPORTS]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and node.attr in WALL_CLOCK and isinstance(node.value, ast.Name) \
                and node.value.id in ("datetime", "date"):
            bad.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return bad


def test_workflow_code_imports_nothing_that_reaches_the_clock_or_io() -> None:
    bad = [f"{path.relative_to(ROOT)}:{hit}" for path in sorted((ROOT / "workflows").rglob("*.py"))
           for hit in _nondeterministic(path)]
    assert not bad, "workflows/ reaches outside deterministic code:\n" + "\n".join(bad)


def test_the_determinism_check_sees_imports_and_clock_reads(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import time\nfrom datetime import datetime\nfrom os import path\n\n"
                     "def f():\n    return datetime.now()\n")
    assert _nondeterministic(probe) == ["1: import time", "3: import os", "6: datetime.now"]


# --- worker/'s rooms ------------------------------------------------------------------------------

def _room_public(room: Path) -> list[str] | None:
    """``__all__`` of a room's ``__init__.py`` (the modules other rooms may import), None without one."""
    init = room / "__init__.py"
    if not init.exists():
        return None
    for node in _tree(init).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            return list(ast.literal_eval(node.value))
    return None


def _room_shape(worker: Path) -> list[str]:
    """What keeps ``worker`` from being rooms: a module beside the rooms, a room without a docstring
    or ``__all__``, or an ``__all__`` naming a module the room does not have."""
    bad = [f"{p.name}: a module beside the rooms" for p in sorted(worker.glob("*.py"))
           if p.name != "__init__.py"]
    for room in sorted(p for p in worker.iterdir() if p.is_dir() and p.name != "__pycache__"):
        public = _room_public(room)
        init = room / "__init__.py"
        if public is None or not init.exists() or ast.get_docstring(ast.parse(init.read_text())) is None:
            bad.append(f"{room.name}/: no __init__.py with a docstring and __all__")
            continue
        bad += [f"{room.name}/: __all__ names {name}, which it does not have" for name in public
                if not (room / f"{name}.py").exists()]
    return bad


def _cross_room_imports(worker: Path) -> list[str]:
    """Imports from one room of ``worker`` into another that do not go through a public module."""
    public = {room.name: set(_room_public(room) or ())
              for room in worker.iterdir() if room.is_dir() and room.name != "__pycache__"}
    bad = []
    for path in sorted(worker.rglob("*.py")):
        here = path.relative_to(worker).parts[0]
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[:2] != ["mcpsync", "worker"] or len(parts) < 4 or parts[2] in (here, "__init__"):
                    continue
                room, module = parts[2], parts[3]
                private = (worker / room / f"{module}.py").exists() and module not in public.get(room, ())
                if private:
                    bad.append(f"{path.relative_to(worker.parent)}:{node.lineno}: {name}"
                               f" ({room}/ does not export {module})")
    return bad


def test_worker_is_rooms() -> None:
    bad = _room_shape(ROOT / "worker")
    assert not bad, "worker/ is not rooms:\n" + "\n".join(bad)


def test_rooms_import_each_other_only_through_their_public_modules() -> None:
    bad = _cross_room_imports(ROOT / "worker")
    assert not bad, "imports across rooms:\n" + "\n".join(bad)


def test_the_room_checks_see_a_stray_module_and_a_private_import(tmp_path: Path) -> None:
    worker = tmp_path / "worker"
    for room, public in (("main", '["config"]'), ("cli", '["start"]')):
        (worker / room).mkdir(parents=True)
        (worker / room / "__init__.py").write_text(f'"""The {room} room."""\n\n__all__ = {public}\n')
    (worker / "main" / "config.py").write_text("")
    (worker / "main" / "secret.py").write_text("")
    (worker / "cli" / "start.py").write_text(
        "from mcpsync.worker.main import config, secret\n"
        "def f():\n    import mcpsync.worker.main.secret\n")
    assert _room_shape(worker) == []
    (worker / "loose.py").write_text("")
    assert "loose.py: a module beside the rooms" in _room_shape(worker)
    assert _cross_room_imports(worker) == [
        "worker/cli/start.py:1: mcpsync.worker.main.secret (main/ does not export secret)",
        "worker/cli/start.py:3: mcpsync.worker.main.secret (main/ does not export secret)"]


# --- SQL lives in activities/ledger/ ----------------------------------------------------------------

PRODUCT = ("workflows", "activities", "worker", "fixture", "temporal", "mcpsync")  # the wheel's folders
SQL_HOME = ROOT / "activities" / "ledger"
SQL = re.compile(r"\b(SELECT\s|INSERT\s+INTO\b|UPDATE\s+\w+(\s+\w+)?\s+SET\b|DELETE\s+FROM\b"
                 r"|(CREATE|ALTER|DROP)\s+(TABLE|DATABASE|INDEX|ROLE|FUNCTION|POLICY)\b|TRUNCATE\s"
                 r"|GRANT\s|LISTEN\s|NOTIFY\s|pg_notify|pg_advisory)")


def _sql_strings(path: Path) -> list[str]:
    """String literals (f-strings' text parts included, docstrings left out) that read as SQL."""
    tree = _tree(path)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [f"{node.lineno}: {node.value[:60]!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and SQL.search(node.value)]


def test_no_sql_outside_the_ledger() -> None:
    bad = [f"{path.relative_to(ROOT)}:{hit}" for top in PRODUCT for path in sorted((ROOT / top).rglob("*.py"))
           if not path.is_relative_to(SQL_HOME) for hit in _sql_strings(path)]
    assert not bad, "SQL outside activities/ledger/:\n" + "\n".join(bad)


def test_the_sql_check_sees_queries_but_not_docstrings(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('"""UPDATE subscriptions SET state: the doc may say it."""\n'
                     'def f(conn, db):\n    """SELECT in a docstring is prose."""\n'
                     '    conn.execute("SELECT 1 FROM audit "\n                 "WHERE kind = %s")\n'
                     '    conn.execute(f\'CREATE DATABASE "{db}"\')\n'
                     '    return "selected rows"\n')
    assert _sql_strings(probe) == ["4: \'SELECT 1 FROM audit WHERE kind = %s\'", "6: \'CREATE DATABASE \"\'"]


# --- one namespace ------------------------------------------------------------------------------------

CHECKOUT_ONLY = ("workflows", "activities", "worker", "temporal", "fixture")  # mcpsync.* in the wheel
_NOT_SOURCE = {".git", ".venv", ".state", "build", "dist", "node_modules", "__pycache__"}


def _source_files(top: Path) -> list[Path]:
    """Every ``.py`` file under ``top``, never descending into ``_NOT_SOURCE`` folders (a venv alone
    holds thousands)."""
    found: list[Path] = []
    for entry in sorted(top.iterdir()):
        if entry.is_dir() and entry.name not in _NOT_SOURCE:
            found += _source_files(entry)
        elif entry.suffix == ".py":
            found.append(entry)
    return found


# A line that may import a bare top-level package (``import worker``, ``import x, worker``, ``from
# worker.x import``): only a file holding one is parsed (most files import ``mcpsync.*`` alone).
_MAY_IMPORT_BARE = re.compile(r"^\s*(?:from|import)\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*(?:"
                              + "|".join(CHECKOUT_ONLY) + r")\b", re.MULTILINE)


def _bare_imports(path: Path) -> list[str]:
    if not _MAY_IMPORT_BARE.search(path.read_text(encoding="utf-8")):
        return []
    return [f"{line}: {name}" for line, name in _imports(path) if name.split(".")[0] in CHECKOUT_ONLY]


def test_nothing_imports_a_bare_top_level_package() -> None:
    """``from worker.x import`` would pass in a checkout (pytest puts the repo root on ``sys.path``)
    and break only in the wheel: every import names ``mcpsync.worker.x``."""
    bad = [f"{path.relative_to(ROOT)}:{hit}" for path in _source_files(ROOT) for hit in _bare_imports(path)]
    assert not bad, "bare top-level imports:\n" + "\n".join(bad)


def test_the_bare_import_check_sees_both_forms(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import worker.cli\nfrom activities.ledger import Ledger\n"
                     "from mcpsync.worker import cli\nfrom sim import engine\n"
                     "if True:\n    import json as j, fixture.store\n")
    assert _bare_imports(probe) == ["1: worker.cli", "2: activities.ledger", "6: fixture.store"]
    alone = tmp_path / "alone.py"
    alone.write_text("import json as j, temporal\n")
    assert _bare_imports(alone) == ["1: temporal"]
