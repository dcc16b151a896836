"""Terminal injection: ``mcpsync content get`` escapes what a terminal would act
on when stdout is a terminal, and writes the bytes exactly as read to a pipe or a file; every
other line the CLI prints escapes what an upstream chose (here: a MIME type in ``history``)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
from pathlib import Path

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.content import ReadBody
from mcpsync.workflows.digest import ContentPart, content_digest
from tests import cli_process
from tests.conftest import ledger_rows
from tests.integration.test_ledger import _accept, _active, _issue
from tests.integration.test_outbox import settled

REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTILE_MIME = "text/plain\x1b]0;pwned\x07\x1b[2J\u202e\nreceipt #999 forged"
HOSTILE = "title\x1b]0;pwned\x07 \x1b[2J\x1b[31mred\x1b[0m \u202eevil\r\nsecond line\té\n" + "padding " * 20
_cli = cli_process.run_config  # mcpsync --config FILE ..., against the file's database, in bytes


def _on_a_terminal(conf: Path, *args: str) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    """The command run with its stdout on a pseudo-terminal: its result and what the terminal got."""
    leader, follower = pty.openpty()
    try:
        return _cli(conf, *args, stdout=follower), _read_all(leader)
    finally:
        os.close(follower)
        os.close(leader)


def _read_all(fd: int) -> bytes:
    got = b""
    while select.select([fd], [], [], 0.5)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


async def test_content_get_escapes_controls_on_a_terminal_only(ledger: Ledger, database_url: str,
                                                                tmp_path: Path) -> None:
    body = HOSTILE.encode()
    digest = content_digest([ContentPart("text", "text/plain", body)])
    key = await _active(ledger, "demo://sec/terminal")
    ordinal = await _issue(ledger, key)
    await ledger.content.stage(key, ordinal,
                               ReadBody(digest=digest, mime_type="text/plain", kind="text", body=body))
    assert await _accept(ledger, key, ordinal, digest) == "ACCEPTED"
    receipt = (await ledger.reports.receipts(key))[-1].receipt_id
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    args = ("content", "get", "--receipt", str(receipt), "--subject", key.subject)

    piped = _cli(conf, *args)
    assert piped.returncode == 0 and piped.stdout == body, "a pipe gets the bytes exactly as read"
    target = tmp_path / "body.txt"
    assert _cli(conf, *args, "-o", str(target)).returncode == 0
    assert target.read_bytes() == body

    tty, shown = _on_a_terminal(conf, *args)
    assert tty.returncode == 0, tty.stderr
    assert b"\x1b" not in shown and b"\x07" not in shown and "\u202e".encode() not in shown
    text = shown.decode()
    assert "\\x1b]0;pwned\\x07" in text and "\\x1b[31mred" in text and "\\u202eevil" in text
    assert "second line\té" in text, "newlines, tabs and printable text stay as they are"


async def test_history_escapes_a_hostile_mime_type(ledger: Ledger, database_url: str, tmp_path: Path) -> None:
    """A server's MIME type goes raw into the receipt; ``mcpsync history`` shows it escaped, on a
    terminal and through a pipe alike, and a newline in it cannot forge a line of its own."""
    key = await _active(ledger, "demo://sec/terminal/mime")
    ordinal = await _issue(ledger, key)
    digest = content_digest([ContentPart("text", "text/plain", b"x")])
    await ledger.content.stage(key, ordinal,
                               ReadBody(digest=digest, mime_type="text/plain", kind="text", body=b"x"))
    assert await _accept(ledger, key, ordinal, digest) == "ACCEPTED"
    await ledger_rows(ledger, "UPDATE resource_versions SET mime_type = %s WHERE workflow_id = %s",
                      HOSTILE_MIME, key.workflow_id)
    await ledger_rows(ledger, "UPDATE outbox SET detail = detail || jsonb_build_object('mime_type', %s::text)"
                      " WHERE workflow_id = %s", HOSTILE_MIME, key.workflow_id)
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n[[servers]]\nname = "{key.server}"\n'
                    f'transport = "http"\nurl = "http://127.0.0.1:1/mcp"\nsubjects = ["{key.subject}"]\n')
    args = ("history", "--server", key.server, "--subject", key.subject, "--uri", key.uri)

    tty, shown = _on_a_terminal(conf, *args)
    piped = _cli(conf, *args)
    for out in (shown, piped.stdout):
        assert tty.returncode == 0 and piped.returncode == 0, (tty.stderr, piped.stderr)
        assert b"\x1b" not in out and b"\x07" not in out and "\u202e".encode() not in out, out
        text = out.decode()
        assert "text/plain\\x1b]0;pwned\\x07\\x1b[2J\\u202e\\x0areceipt #999 forged" in text, text
        assert len([ln for ln in text.splitlines() if ln.strip()]) == 1, "one receipt, one line"
    # --json: JSON's own escapes, and the MIME type comes back exactly (nothing lost).
    as_json = _cli(conf, *args, "--json")
    raw = (b"\x1b", "\u202e".encode())
    assert as_json.returncode == 0 and not any(r in as_json.stdout for r in raw)
    assert [e["mime_type"] for e in json.loads(as_json.stdout) if e["kind"] == "receipt"] == [HOSTILE_MIME]
    await settled(ledger, key.subject)
    [[position]] = await ledger_rows(ledger, "SELECT position FROM outbox WHERE workflow_id = %s",
                                     key.workflow_id)
    tail = _cli(conf, "outbox", "tail", "--after", str(position - 1), "--limit", "1", "--json")
    assert tail.returncode == 0 and not any(r in tail.stdout for r in raw), tail
    assert json.loads(tail.stdout)["mime_type"] == HOSTILE_MIME
