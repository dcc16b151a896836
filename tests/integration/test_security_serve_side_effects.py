"""``mcpsync serve`` leaves nothing behind that nobody asked for (BOUNDARIES.md "MCP face" and
"CLI and config"): run without ``--consumer`` it follows the outbox with no durable registration
(no consumer row to lag forever, hold back retention and feed the lag alert), and a token for a
subject no configured server lists is named (the subject, never the token) in one warning at
start. Real PostgreSQL (a fresh database per test) and the real ``mcpsync`` command."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.cli.root import build_parser
from mcpsync.worker.serve.cursors import CursorSigner
from mcpsync.worker.serve.run import follow_outbox
from mcpsync.worker.serve.server import ServeConfig, ServeHub
from tests import cli_process
from tests.conftest import eventually, ledger_rows


async def _emit(ledger: Ledger, subject: str) -> None:
    async with ledger.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO outbox (event_type, workflow_id, subject, server, uri, content_digest, read_ordinal,"
            " detail) VALUES ('version_accepted', 'wf', %s, 's', 'demo://x', 'sha256:00', 1, '{}'::jsonb)",
            (subject,))


async def test_serve_without_consumer_follows_the_outbox_and_registers_no_durable_consumer(
        private_ledger: Ledger) -> None:
    args = build_parser().parse_args(["serve"])  # serve's own default: no --consumer given
    hub = ServeHub(ServeConfig(consumer=args.consumer), private_ledger.pool, CursorSigner(b"k" * 32))
    follower = asyncio.create_task(follow_outbox(hub))
    try:
        # It follows: an event written now is announced (the follower started at the outbox's end).
        async def announced() -> bool:
            await _emit(private_ledger, "alice")
            return hub.stats["announced"] > 0

        await eventually(announced, timeout=20, interval=0.2, what="the outbox event announced")
        assert await ledger_rows(private_ledger, "SELECT name FROM outbox_consumers") == []
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


def test_serve_warns_once_naming_a_token_subject_no_server_lists(tmp_path: Path) -> None:
    config = tmp_path / "mcpsync.toml"
    config.write_text('[[servers]]\nname = "docs"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n'
                      'subjects = ["alice"]\n')
    tokens = {"alice": "alice-token-0123456789", "mallory": "mallory-token-0123456789"}
    env = {**cli_process.without_database_url(), "MCPSYNC_STATE_DIR": str(tmp_path / "state"),
           "MCPSYNC_SERVE_TOKENS": json.dumps(tokens)}
    # Every start-up check passes; the database is unreachable, so serve then stops (exit 6): no
    # listener needed.
    env["MCPSYNC_DATABASE_URL"] = "postgresql://mcpsync@127.0.0.1:1/mcpsync?connect_timeout=2"
    r = cli_process.run(["--config", str(config), "serve"], env=env)
    assert r.returncode == 6, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("mcpsync: warning:")]
    assert len(warnings) == 1, r.stderr
    assert "'mallory'" in warnings[0] and "'alice'" not in warnings[0]
    assert all(token not in r.stderr + r.stdout for token in tokens.values())
