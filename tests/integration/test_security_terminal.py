"""Terminal injection: ``mcpsync content get`` escapes what a terminal would act
on when stdout is a terminal, and writes the bytes exactly as read to a pipe or a file."""

from __future__ import annotations

import os
import pty
import select
from pathlib import Path

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger_content import ReadBody
from mcpsync.workflows.digest import ContentPart, content_digest
from tests import cli_process
from tests.integration.test_ledger import _accept, _active, _issue

REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "title\x1b]0;pwned\x07 \x1b[2J\x1b[31mred\x1b[0m \u202eevil\r\nsecond line\té\n" + "padding " * 20
_cli = cli_process.run_config  # mcpsync --config FILE ..., against the file's database, in bytes


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
    receipt = (await ledger.receipts(key))[-1].receipt_id
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    args = ("content", "get", "--receipt", str(receipt), "--subject", key.subject)

    piped = _cli(conf, *args)
    assert piped.returncode == 0 and piped.stdout == body, "a pipe gets the bytes exactly as read"
    target = tmp_path / "body.txt"
    assert _cli(conf, *args, "-o", str(target)).returncode == 0
    assert target.read_bytes() == body

    leader, follower = pty.openpty()
    try:
        tty = _cli(conf, *args, stdout=follower)
        shown = _read_all(leader)
    finally:
        os.close(follower)
        os.close(leader)
    assert tty.returncode == 0, tty.stderr
    assert b"\x1b" not in shown and b"\x07" not in shown and "\u202e".encode() not in shown
    text = shown.decode()
    assert "\\x1b]0;pwned\\x07" in text and "\\x1b[31mred" in text and "\\u202eevil" in text
    assert "second line\té" in text, "newlines, tabs and printable text stay as they are"
