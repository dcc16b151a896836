"""Dependencies point one way: workflows <- activities <- worker (the design card's layout).

Read from the source with ``ast`` (every ``import`` and ``from ... import``, including the ones
inside functions), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "workflows": ("activities", "worker", "benchmarks", "sim"),  # deterministic code: no I/O layer above it
    "activities": ("worker", "benchmarks", "sim"),  # all I/O, driven by the worker, never driving it
    "worker": ("sim",),  # the simulator is a development tool of the source tree (the CLI loads it by name)
    "sim": ("activities", "worker", "benchmarks"),  # pure: it interprets the workflows' program in memory
}


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
           if _layer(name) in FORBIDDEN[package]]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def _layer(module: str) -> str:
    """The folder an import names: ``mcpsync.worker.metrics`` (installed name) -> ``worker``."""
    return module.removeprefix("mcpsync.").split(".")[0]


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from mcpsync.worker.runtime import start_subscription\n")
    assert _imports(probe) == [(2, "mcpsync.worker.runtime")]
    assert [_layer(name) for _, name in _imports(probe)] == ["worker"]  # the folder, with or without mcpsync.
