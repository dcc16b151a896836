"""Dependencies point one way: workflows <- activities <- worker, and workflows <- fixture <- worker.

Read from the source with ``ast`` (every ``import`` and ``from ... import``, including the ones
inside functions), so a lazy import cannot hide a cycle. Within ``workflows/``, activities use
only the pure modules (rules, records, names): never one that imports temporalio or defines a
``@workflow.defn`` class, so the I/O layer does not load workflow code.
"""

from __future__ import annotations

import ast
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
# (``sim/cycles.py``: ``McpSessionActivities`` over its own server and ledger); nothing else of the I/O layer.
ALLOWED = {"sim": ("mcpsync.activities.mcp_session", "mcpsync.activities.ledger",
                   "mcpsync.activities.ledger.content")}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
    tree = ast.parse(path.read_text(), str(path))
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
                    "enum", "hashlib", "hmac", "json", "pydantic", "re", "typing", "urllib.parse",
                    "temporalio", "temporalio.common", "temporalio.exceptions", "temporalio.workflow"}
WALL_CLOCK = {"now", "utcnow", "today", "fromtimestamp"}  # datetime/date class methods that read the clock


def _nondeterministic(path: Path) -> list[str]:
    """Imports outside ``WORKFLOW_IMPORTS`` (mcpsync's own aside) and ``datetime.now()``-like clock reads."""
    bad = [f"{line}: import {name}" for line, name in _imports(path)
           if name.split(".")[0] != "mcpsync" and name not in WORKFLOW_IMPORTS]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
