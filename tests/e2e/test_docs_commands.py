"""Every command the docs show runs, against one real ``mcpsync up`` stack, with its documented exit
code: each ``examples:`` line of every ``--help`` (the parser tree of ``mcpsync.worker.cli``) and each
``mcpsync ...`` line of the fenced ``sh`` blocks of README.md and every page of docs/ (its dated
benchmark journals and decision records are history, not instructions).

How a line is read (``doc_commands``):
- A trailing comment ``# not run in tests: <reason>`` keeps a line out (it starts a long-lived
  process, needs a second terminal, or destroys the stack); the test lists every such line and
  asserts each has a reason, so nothing is left out silently.
- A trailing comment naming ``exit N`` is the line's documented exit code; otherwise it is 0.
- Leading ``NAME=value`` words are the command's environment; ``mcpsync`` or ``.venv/bin/mcpsync``
  is the command; the arguments stop at the first shell operator (``|``, ``&&``, ``>``): a pipe's
  other end (``jq``) is not mcpsync's.
- ``PLACEHOLDERS`` maps the docs' example names onto the ``up`` stack's: the server ``docs`` is the
  demo server, the subjects ``alice`` / ``team-a`` the demo subject, ``--receipt 42`` a receipt the
  demo subscription has, ``-o FILE`` a file under the test's temporary directory.
Lines that change the stack (``close``, ``revoke``, ``outbox drop``) run last, in their order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mcpsync.worker.stack.common import REPO_ROOT
from tests import cli_process
from tests.conftest import eventually, fresh_database
from tests.e2e.test_e2e_faults import MCPSYNC

DOCS = ("README.md", *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")))
NOT_RUN = re.compile(r"#.*?\bnot run in tests:\s*(?P<reason>[^)]*)")
EXIT = re.compile(r"#.*?\bexit (?P<code>\d+)\b")
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1", "<"}
DEMO_SUBJECT = "anonymous"
DEMO_URI = "demo://policy/escalation"
PLACEHOLDERS = {"docs": "demo", "alice": DEMO_SUBJECT, "team-a": DEMO_SUBJECT, "old-indexer": "new-indexer"}
CHANGES_THE_STACK = {"close", "revoke", "drop", "down"}


@dataclass
class DocCommand:
    where: str  # "README.md" or "mcpsync outbox tail --help"
    line: str
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    exit_code: int = 0
    not_run: str | None = None  # the reason, for a line kept out


def parse_line(where: str, line: str) -> DocCommand | None:
    """The command a doc line shows, or None when the line is not an ``mcpsync`` command."""
    marked = NOT_RUN.search(line)
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words or words[0] not in ("mcpsync", ".venv/bin/mcpsync"):
        return None
    args = []
    for word in words[1:]:
        if word in OPERATORS:
            break
        args.append(word)
    code = EXIT.search(line)
    return DocCommand(where, line.strip(), env, args, int(code["code"]) if code else 0,
                      marked["reason"].strip() if marked else None)


def _help_examples(parser: argparse.ArgumentParser, prog: str) -> list[DocCommand]:
    found = []
    epilog = parser.epilog or ""
    if "examples:" in epilog:
        for line in epilog.split("examples:", 1)[1].splitlines():
            command = parse_line(f"{prog} --help", line)
            if command is not None:
                found.append(command)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if child.prog.endswith(f" {name}"):  # each subparser once, not once per alias
                    found += _help_examples(child, f"{prog} {name}")
    return found


def doc_commands() -> list[DocCommand]:
    """Every command of the docs and the help, in doc order, each once."""
    from mcpsync.worker.cli.root import build_parser

    found = _help_examples(build_parser(), "mcpsync")
    for doc in DOCS:
        text = (REPO_ROOT / doc).read_text()
        for block in re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            found += [c for c in (parse_line(doc, line) for line in block.splitlines()) if c is not None]
    seen: set[tuple[str, ...]] = set()
    unique = []
    for command in found:
        key = (*command.args, *sorted(f"{k}={v}" for k, v in command.env.items()))
        if key not in seen:
            seen.add(key)
            unique.append(command)
    return unique


def test_every_command_left_out_says_why() -> None:
    commands = doc_commands()
    assert len(commands) > 40
    assert [c.line for c in commands if c.not_run is not None and not c.not_run] == []


FOLLOWER_FLAGS = {"-f", "--follow", "--watch"}
FOLLOW_FOR = 0.5  # seconds a follower must keep running


@dataclass
class Up:
    state: Path
    env: dict[str, str]
    tmp: Path


def _start_up(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen([*MCPSYNC, "up", "--port", "0", "--ui-port", "0", "--metrics-port", "0",
                                 "--serve-port", "0", "--churn", "0", "--exit-after", "300"],
                                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


@pytest.fixture
async def up_stack(postgres_url: str, tmp_path: Path) -> AsyncIterator[Up]:
    """``mcpsync up`` on a database of its own, the demo subscription converged."""
    state = tmp_path / "state"
    log_path = tmp_path / "up.log"
    async with fresh_database(postgres_url) as url:
        env = {**os.environ, "MCPSYNC_STATE_DIR": str(state), "MCPSYNC_DATABASE_URL": url}
        up = _start_up(env, log_path)
        try:
            await eventually(lambda: "ready in" in log_path.read_text(), timeout=90, what="'up' ready")
            yield Up(state, env, tmp_path)
        finally:
            if up.poll() is None:
                up.send_signal(signal.SIGINT)
            try:
                up.wait(30)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait(10)


def _json(up: Up, *args: str) -> Any:
    r = cli_process.run([*args, "--json"], env=up.env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _substituted(command: DocCommand, up: Up) -> list[str]:
    args = []
    for i, word in enumerate(command.args):
        before = command.args[i - 1] if i else ""
        if before == "--receipt" and word.isdigit():
            word = str(_json(up, "history", "--server", "demo", "--uri", DEMO_URI)[-1]["receipt_id"])
        elif before == "--position" and word.isdigit():
            consumer = command.args[command.args.index("--consumer") + 1]
            [info] = [c for c in _json(up, "outbox", "consumers") if c["name"] == consumer]
            word = str(info["delivered_up_to"])
        elif before == "-o" and word not in ("wide", "json"):
            word = str(up.tmp / word)
        elif word == "mcpsync.toml" and before == "--config":
            word = str(up.state / "mcpsync.toml")
        args.append(PLACEHOLDERS.get(word, word))
    return args


def _run(command: DocCommand, up: Up) -> tuple[int | None, str]:
    """The exit code (None: a follower still running after ``FOLLOW_FOR``) and stderr."""
    args = _substituted(command, up)
    env = {**up.env, **command.env}
    if FOLLOWER_FLAGS & set(args):
        try:
            r = cli_process.run(args, env=env, timeout=FOLLOW_FOR)
        except subprocess.TimeoutExpired:
            return None, ""
        return r.returncode, r.stderr
    r = cli_process.run(args, env=env, timeout=60)
    return r.returncode, r.stderr


def _verdict(command: DocCommand, up: Up) -> str | None:
    """None when the line exits as documented (a follower: keeps running); else what went wrong."""
    code, err = _run(command, up)
    expected = None if FOLLOWER_FLAGS & set(command.args) else command.exit_code
    if code == expected:
        return None
    return f"{command.where}: {command.line!r} exited {code}, documented {expected}: {err.strip()[-300:]}"


async def test_every_documented_command_runs_with_its_documented_exit_code(up_stack: Up) -> None:
    commands = [c for c in doc_commands() if c.not_run is None]
    # The simulator needs no stack and has a fixed cost of seconds: it runs beside the rest.
    beside = [c for c in commands if c.args[:1] == ["simulate"]]
    in_order = ([c for c in commands if c not in beside and not CHANGES_THE_STACK & set(c.args[:2])]
                + [c for c in commands if CHANGES_THE_STACK & set(c.args[:2]) and c.args[:1] != ["down"]]
                + [c for c in commands if c.args[:1] == ["down"]])
    assert in_order[-1].args == ["down"], "the last command stops the stack"
    simulated = asyncio.gather(*(asyncio.to_thread(_verdict, c, up_stack) for c in beside))
    wrong = [v for v in (_verdict(c, up_stack) for c in in_order) if v is not None]
    wrong += [v for v in await simulated if v is not None]
    assert wrong == []
    assert not (up_stack.state / "runtime.json").exists(), "'mcpsync down' stopped the stack"
