"""docs/security.md names the tests that check its statements: each named test exists.

Every backticked ``test_*`` name and ``tests/…`` path on the page must be a test function defined
under ``tests/`` (``def`` or ``async def``) or an existing file, so a renamed or deleted test cannot
leave a statement standing unchecked; and every row of the threat-model table names a test.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "security.md"
_NAME = re.compile(r"`(?:[\w/.]+\.py::)?(test_\w+)`")
_PATH = re.compile(r"`(tests/[\w/.]+\.py)(?:::\w+)?`")


def _defined_tests() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        found.update(re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)\s*\(", path.read_text(), re.M))
    return found


def test_every_test_the_security_page_names_exists() -> None:
    text = PAGE.read_text()
    names = set(_NAME.findall(text))
    assert len(names) > 40  # the page cites its tests; an empty match means the pattern broke
    missing = sorted(names - _defined_tests())
    assert missing == [], f"docs/security.md names tests that do not exist: {missing}"
    paths = set(_PATH.findall(text))
    assert sorted(p for p in paths if not (ROOT / p).is_file()) == []


def test_every_row_of_the_threat_model_names_a_test() -> None:
    text = PAGE.read_text()
    table = text.split("### Who can reach what", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| **")]
    assert len(rows) >= 8
    for row in rows:
        tests_cell = row.rstrip(" |").rsplit("|", 1)[1]
        assert _NAME.search(tests_cell), f"a threat-model row names no test: {row[:80]}"
