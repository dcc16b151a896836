"""Hostile tests of ``mcpsync serve``'s HTTP and session layer (docs/security.md "The MCP face"):
real serve processes over real sockets, on the session's PostgreSQL; no Temporal, no upstream (an
empty ledger is enough for every boundary here). Each test is named after the finding it covers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import stat
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError

from mcpsync.worker.stack.common import state_dir
from tests import cli_process
from tests.conftest import ledger_rows, unique
from tests.e2e.serve_helpers import ServeProcess, events_poll, raw_session, serve_client, serve_conf

ALICE, MALLORY = "alice-sec", "mallory-sec"
TOKENS = {ALICE: "alice-token-0123456789abcdef", MALLORY: "mallory-token-0123456789abcd"}
JSON_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "resources/list"}


def _auth(subject: str) -> dict[str, str]:
    return {**JSON_HEADERS, "Authorization": f"Bearer {TOKENS[subject]}"}


@pytest.fixture(scope="module")
async def serve(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> AsyncIterator[ServeProcess]:
    """One serve process with the default flags, shared by the tests that need nothing else."""
    conf = serve_conf(tmp_path_factory.mktemp("serve-sec"), database_url)
    process = await ServeProcess.start(conf, TOKENS, consumer=unique("serve-sec"))
    try:
        yield process
    finally:
        await process.stop()
        await ledger_rows_by_url(database_url)


async def ledger_rows_by_url(database_url: str) -> None:
    from mcpsync.worker.main.connect import open_ledger

    ledger = await open_ledger(database_url, max_size=1)
    try:
        await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name LIKE %s", "serve-sec-%")
    finally:
        await ledger.pool.close()


async def _raw_request(port: int, head: str, *, host: str = "127.0.0.1", timeout: float = 10) -> bytes:
    """One request written as is on a new socket; the status line and headers of the answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head.encode("latin-1"))
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    finally:
        writer.close()


async def test_a_session_answers_only_the_subject_that_opened_it(serve: ServeProcess) -> None:
    """Another subject's token on a session's id gets 404, exactly as an unknown id, on POST,
    GET (the notification stream) and DELETE; the owner keeps the session; no id in the INFO log."""
    async with httpx2.AsyncClient(timeout=30) as raw:
        session_id = await raw_session(raw, serve.url, _auth(ALICE))
        unknown = {**_auth(MALLORY), "mcp-session-id": "0" * 32, "mcp-protocol-version": "2025-11-25"}
        foreign = {**unknown, "mcp-session-id": session_id}
        for method in ("POST", "GET", "DELETE"):
            body = json.dumps(LIST).encode() if method == "POST" else None
            theirs = await raw.request(method, serve.url, content=body, headers=foreign)
            nobody = await raw.request(method, serve.url, content=body, headers=unknown)
            assert (theirs.status_code, theirs.content) == (nobody.status_code, nobody.content) and \
                theirs.status_code == 404, (method, theirs.status_code, theirs.content)
        own = {**_auth(ALICE), "mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}
        still = await raw.post(serve.url, json=LIST, headers=own)
        assert still.status_code == 200 and b"resources" in still.content, still.content
        async with raw.stream("GET", serve.url, headers={**own, "Accept": "text/event-stream"}) as stream:
            assert stream.status_code == 200  # the owner's stream was never taken
        assert (await raw.delete(serve.url, headers=own)).status_code == 200
    log = serve.log.read_text()
    assert session_id not in log, "a session id reached the log at INFO"


async def test_foreign_origin_and_host_are_refused_on_every_bind_before_auth(
    tmp_path: Path, database_url: str
) -> None:
    """On 127.0.0.2 (not a localhost name) a foreign Origin is 403 and a foreign Host 421,
    with or without a token (checked before the token); the bind's own Host and no Origin pass."""
    conf = serve_conf(tmp_path, database_url)
    process = await ServeProcess.start(
        conf, TOKENS, consumer=unique("serve-sec"), extra=("--host", "127.0.0.2")
    )
    try:
        port, url = process.port, process.url
        assert url.startswith("http://127.0.0.2:")
        async with httpx2.AsyncClient(timeout=30) as raw:
            for headers in (_auth(ALICE), JSON_HEADERS):
                evil_origin = await raw.post(url, json=LIST, headers={**headers, "Origin": "http://evil.example"})
                assert evil_origin.status_code == 403, (evil_origin.status_code, evil_origin.content)
                evil_host = await raw.post(url, json=LIST, headers={**headers, "Host": "attacker.example"})
                assert evil_host.status_code == 421, (evil_host.status_code, evil_host.content)
            own = await raw.post(url, json=LIST, headers={**_auth(ALICE), "Origin": f"http://127.0.0.2:{port}"})
            assert own.status_code != 403 and own.status_code != 421, own.status_code
            assert (await raw.post(url, json=LIST, headers=JSON_HEADERS)).status_code == 401
    finally:
        await process.stop()


async def test_slow_headers_are_timed_out_and_connections_are_capped(
    tmp_path: Path, database_url: str
) -> None:
    """A head sent one byte at a time is cut at --header-timeout; past --max-connections a
    new connection gets 503 and is closed, while an established client's requests still work. Also
    --allowed-host / --allowed-origin: the values named are served, the defaults no longer are."""
    conf = serve_conf(tmp_path, database_url)
    cap, limit = 6, 1.0
    extra = ("--header-timeout", str(limit), "--max-connections", str(cap), "--allowed-host", "mcp.example",
             "--allowed-origin", "https://app.example")
    process = await ServeProcess.start(conf, TOKENS, consumer=unique("serve-sec"), extra=extra)
    slow: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=1)) as client:
            named = {**_auth(ALICE), "Host": "mcp.example:1", "Origin": "https://app.example"}
            assert await raw_session(client, process.url, named)  # initialize answered: a session
            default_host = await client.post(process.url, json=LIST, headers=_auth(ALICE))
            assert default_host.status_code == 421  # 127.0.0.1:PORT is no longer in the list
            # Slow clients: each sends a byte of its head every 0.1 s, until the cap refuses one.
            refused = b""
            for _ in range(cap + 2):
                reader, writer = await asyncio.open_connection("127.0.0.1", process.port)
                writer.write(b"G")
                try:
                    refused = await asyncio.wait_for(reader.read(200), 0.05)
                except TimeoutError:
                    slow.append((reader, writer))
                    continue
                writer.close()
                break
            assert refused.startswith(b"HTTP/1.1 503"), refused
            assert len(slow) == cap - 1  # the established client holds the last place
            assert await raw_session(client, process.url, named)
            started = time.monotonic()
            closed: set[int] = set()
            while len(closed) < len(slow) and time.monotonic() - started < limit + 3:
                for i, (reader, writer) in enumerate(slow):
                    if i in closed:
                        continue
                    if reader.at_eof() or writer.is_closing():
                        closed.add(i)
                        continue
                    writer.write(b"E")
                    try:
                        await asyncio.wait_for(reader.read(1), 0.01)
                        closed.add(i)  # b"" (EOF): closed by serve
                    except TimeoutError:
                        pass
                    except ConnectionError:
                        closed.add(i)
                await asyncio.sleep(0.1)
            waited = time.monotonic() - started
            assert len(closed) == len(slow) and waited < limit + 1.5, (len(closed), waited)
    finally:
        for _, writer in slow:
            writer.close()
        await process.stop()
    assert "Traceback" not in process.log.read_text()


async def test_a_chunked_body_over_the_limit_is_413_without_a_traceback(serve: ServeProcess) -> None:
    """A chunked POST past the 1 MB body limit is 413 (as with Content-Length), not 500,
    and nothing is logged with a traceback."""
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": 1, "method": "resources/list", "params": {"x": "'
        for _ in range(40):
            yield b"x" * 50_000
        yield b'"}}'

    async with httpx2.AsyncClient(timeout=30) as raw:
        chunked = await raw.post(serve.url, content=chunks(), headers=_auth(ALICE))
        assert chunked.status_code == 413, (chunked.status_code, chunked.content[:200])
        small = await raw_session(raw, serve.url, _auth(ALICE))  # the process still serves
        assert small
    assert "Traceback" not in serve.log.read_text()


def _url_derived_cursor(database_url: str, position: str, subject: str) -> str:
    """The attacker's forgery against d6e7863: its key was SHA-256 of a fixed prefix and the ledger URL."""
    key = hashlib.sha256(b"mcpsync-serve-cursor:" + database_url.encode()).digest()
    mac = hmac.new(key, f"E\x00{position}\x00{subject}".encode(), hashlib.sha256).digest()[:16]
    return f"E.{position}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"


async def test_a_cursor_forged_from_the_ledger_url_is_refused(serve: ServeProcess, database_url: str) -> None:
    """The cursor key is random (0600 in the state dir), not derived from the ledger URL: a
    cursor computed offline from the URL does not verify."""
    async with serve_client(serve.url, TOKENS[ALICE], "auto") as client:
        with pytest.raises(MCPError) as forged:
            await events_poll(client, _url_derived_cursor(database_url, "0", ALICE))
        assert forged.value.code == -32602, forged.value
    from mcpsync.worker.serve.cursors import KEY_FILE

    mode = stat.S_IMODE((state_dir() / KEY_FILE).stat().st_mode)
    assert mode == 0o600, oct(mode)


async def test_cursors_reveal_no_position_and_no_other_subjects_activity(serve: ServeProcess) -> None:
    """A cursor carries nothing readable (no outbox position, no listing counter; the same
    position twice gives two different cursors) and another subject's cursor is refused like a forged one."""
    async with serve_client(serve.url, TOKENS[ALICE], "auto") as alice, \
            serve_client(serve.url, TOKENS[MALLORY], "auto") as mallory:
        first, second = (await events_poll(alice, None))["cursor"], (await events_poll(alice, None))["cursor"]
        assert first != second
        for cursor in (first, second):
            assert not re.search(r"(^|\.)\d+(\.|$)", cursor), cursor  # no plain position
            assert (await events_poll(alice, cursor))["events"] == []  # still a working cursor
        with pytest.raises(MCPError) as theirs:
            await events_poll(mallory, first)
        with pytest.raises(MCPError) as forged:
            await events_poll(mallory, first[:-4] + ("AAAA" if not first.endswith("AAAA") else "BBBB"))
        assert theirs.value.code == forged.value.code == -32602
        assert theirs.value.message == forged.value.message, (theirs.value.message, forged.value.message)


def test_duplicate_and_short_tokens_are_refused_at_start(tmp_path: Path, database_url: str) -> None:
    """A token shared by two subjects or a token under 16 characters: one ``mcpsync:
    error:`` line naming no token, exit 2, nothing started (a subject listed twice:
    tests/unit/test_serve_units.py)."""
    conf = serve_conf(tmp_path, database_url)
    env = {k: v for k, v in cli_process.without_database_url().items() if k != "MCPSYNC_SERVE_TOKENS"}
    shared = "shared-token-0123456789"
    for tokens, expect in (
        (json.dumps({"alice": shared, "bob": shared}), "have the same token"),
        (json.dumps({"alice": "x"}), "shorter than 16 characters"),
    ):
        r = cli_process.run(["--config", str(conf), "serve"], env={**env, "MCPSYNC_SERVE_TOKENS": tokens},
                            timeout=30)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr, r.stdout)
        assert r.stderr.startswith("mcpsync: error:") and expect in r.stderr, r.stderr
        assert shared not in r.stderr and "token-0123456789" not in r.stderr


def test_up_refuses_bad_serve_tokens_before_starting_anything(tmp_path: Path) -> None:
    """``mcpsync up`` serves too: a short token is its one error line, exit 2, nothing created."""
    env = {**cli_process.without_database_url(), "MCPSYNC_STATE_DIR": str(tmp_path / "state"),
           "MCPSYNC_SERVE_TOKENS": json.dumps({"alice": "short"})}
    r = cli_process.run(["up"], env=env, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "shorter than 16" in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()


def test_bad_connection_flag_values_are_one_error_line(tmp_path: Path, database_url: str) -> None:
    """The new flags at the CLI boundary: nan, 0, a negative or a non-printable value: exit 2, one line."""
    conf = serve_conf(tmp_path, database_url)
    env = {**cli_process.without_database_url(), "MCPSYNC_SERVE_TOKENS": json.dumps(TOKENS)}
    for args, expect in ((("--header-timeout", "nan"), "--header-timeout"),
                         (("--header-timeout", "-1"), "--header-timeout"),
                         (("--max-connections", "0"), "--max-connections"),
                         (("--allowed-origin", "http://a\x1b.example"), "--allowed-origin")):
        r = cli_process.run(["--config", str(conf), "serve", *args], env=env, timeout=30)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("mcpsync: error:"), r.stderr


async def test_unauthenticated_requests_get_401_before_any_mcp_handling(serve: ServeProcess) -> None:
    """Boundary "MCP face, unauthenticated": no token, a wrong one, Basic, a 15 KB header: 401; a 200 KB
    header: 400 (h11 holds at most 16 KiB of an unfinished head); a foreign Host without a token: 421,
    checked before the token."""
    port = serve.port
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 2\r\n")
    basic = base64.b64encode(f"{ALICE}:{TOKENS[ALICE]}".encode()).decode()
    for extra in ("", "Authorization: Bearer wrong-token-0123456789\r\n", f"Authorization: Basic {basic}\r\n",
                  f"Authorization: Bearer {TOKENS[ALICE][:-1]}\r\n", "X-Pad: " + "a" * 15_000 + "\r\n"):
        answer = await _raw_request(port, head + extra + "\r\n{}")
        assert answer.startswith(b"HTTP/1.1 401"), (extra[:40], answer[:100])
    huge = await _raw_request(port, head + "X-Pad: " + "a" * 200_000 + "\r\n\r\n{}")
    assert huge.startswith(b"HTTP/1.1 400"), huge[:100]
    misdirected = await _raw_request(port, head.replace(f"127.0.0.1:{port}", "attacker.example") + "\r\n{}")
    assert misdirected.startswith(b"HTTP/1.1 421"), misdirected[:100]
    log = serve.log.read_text()
    assert "Traceback" not in log and TOKENS[ALICE] not in log


_ASCII = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
_METHODS = ("initialize", "resources/list", "resources/read", "resources/subscribe", "resources/unsubscribe",
            "resources/templates/list", "events/list", "events/poll", "ping", "tools/call", "nothing/here")
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _ASCII,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ASCII, inner, max_size=4),
                     max_leaves=12)


@st.composite
def _requests(draw: st.DrawFn) -> dict[str, Any]:
    """One HTTP request: a verb, odd headers (tokens, session ids, versions) and a JSON-RPC-ish body."""
    cursor = draw(st.sampled_from(("mallory", "garbage", "none")))
    wanted = _ASCII if cursor == "garbage" else st.none()
    params: Any = draw(st.one_of(st.none(), st.dictionaries(_ASCII, _JSON, max_size=4),
                                 st.fixed_dictionaries({"cursor": wanted, "name": st.just("resource.changed"),
                                                        "uri": _ASCII})))
    if isinstance(params, dict) and draw(st.booleans()):
        params["_meta"] = _ENVELOPE  # a well-formed 2026-07-28 envelope: the request reaches the handlers
    message: Any = {"jsonrpc": draw(st.sampled_from(("2.0", "1.0", None))),
                    "id": draw(st.one_of(st.integers(), _ASCII, st.none(), st.floats(allow_nan=False))),
                    "method": draw(st.sampled_from(_METHODS) | _ASCII), "params": params}
    encoded = json.dumps(message).encode()
    body = draw(st.sampled_from((encoded, encoded, encoded, json.dumps([message, message]).encode(), b""))
                | st.binary(max_size=200))
    return {
        "verb": draw(st.sampled_from(("POST", "POST", "POST", "GET", "DELETE", "PUT", "OPTIONS"))),
        "auth": draw(st.sampled_from(("alice", "alice", "alice", "alice", "none", "junk", "basic"))),
        "session": draw(st.sampled_from(("none", "mallory", "junk"))),
        "version": draw(st.sampled_from((None, "2025-11-25", "2026-07-28", "2026-07-28", "1999-01-01"))),
        "accept": draw(st.sampled_from(("application/json, text/event-stream", "text/html", None))),
        "cursor": cursor,
        "body": body,
        "method_header": draw(st.sampled_from((str(message["method"]),) * 3 + (None, "junk"))),
    }


def test_fuzz_the_request_path_never_500s_nor_leaks_another_subject(serve: ServeProcess) -> None:
    """Hypothesis over the gate and JSON-RPC handling, over real HTTP: no 5xx, no traceback in the log,
    mallory's session id with alice's token is always 404 and mallory's cursor is never accepted for
    alice; afterwards a new session still opens. Long-lived streams (GET on an own session,
    subscriptions/listen, events/stream) are left out: they never end by design."""
    with httpx2.Client(timeout=10) as client:
        mallory_session = asyncio.run(_session_of(serve.url, MALLORY))
        polled = client.post(serve.url, headers={**_MODERN, **_auth(MALLORY)}, json=_poll(None))
        mallory_cursor = polled.json()["result"]["cursor"]

        @settings(max_examples=int(os.environ.get("MCPSYNC_FUZZ_EXAMPLES", "150")), deadline=None,
                  suppress_health_check=list(HealthCheck), database=None)
        @given(case=_requests())
        def one(case: dict[str, Any]) -> None:
            headers = {"Content-Type": "application/json"}
            headers.update({"alice": {"Authorization": f"Bearer {TOKENS[ALICE]}"}, "none": {},
                            "junk": {"Authorization": "Bearer junk-junk-junk-junk"},
                            "basic": {"Authorization": "Basic YWxpY2U6cHc="}}[case["auth"]])
            if case["session"] != "none":
                headers["mcp-session-id"] = mallory_session if case["session"] == "mallory" else "junk"
            if case["version"]:
                headers["mcp-protocol-version"] = case["version"]
            if case["accept"]:
                headers["Accept"] = case["accept"]
            if case["method_header"] and case["method_header"].strip() == case["method_header"]:
                headers["mcp-method"] = case["method_header"]  # (h11 refuses to send padded values)
            body = case["body"]
            if case["cursor"] == "mallory":
                body = body.replace(b'"cursor": null', f'"cursor": "{mallory_cursor}"'.encode())
            answer = client.request(case["verb"], serve.url, headers=headers, content=body)
            statuses[answer.status_code] += 1
            reached[0] += b'"result"' in answer.content or b'"code":-326' in answer.content
            assert answer.status_code < 500, (case, answer.status_code, answer.content[:300])
            legacy = case["version"] in (None, "2025-11-25")  # another goes the stateless 2026-07-28 way
            if case["auth"] == "alice" and case["session"] == "mallory" and legacy:
                assert answer.status_code == 404, (case, answer.status_code, answer.content[:300])
            takes_cursor = b'"method": "events/poll"' in body or b'"method": "resources/list"' in body
            if case["auth"] == "alice" and mallory_cursor.encode() in body and takes_cursor:
                assert b'"result"' not in answer.content, answer.content[:300]  # refused, like a forgery

        statuses: Counter[int] = Counter()
        reached = [0]  # answers from a JSON-RPC handler (a result, or an invalid-params/method error)
        one()
        assert reached[0] >= 5, (statuses, reached)
        assert "cursor" in client.post(serve.url, headers={**_MODERN, **_auth(ALICE)},
                                       json=_poll(None)).json()["result"]
    log = serve.log.read_text()
    assert "Traceback" not in log, log[-3000:]


_ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
             "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "0"},
             "io.modelcontextprotocol/clientCapabilities": {}}
_MODERN = {**JSON_HEADERS, "mcp-protocol-version": "2026-07-28", "mcp-method": "events/poll"}


def _poll(cursor: str | None) -> dict[str, Any]:
    """A stateless 2026-07-28 events/poll (the envelope in ``_meta``)."""
    return {"jsonrpc": "2.0", "id": 9, "method": "events/poll",
            "params": {"name": "resource.changed", "cursor": cursor, "maxEvents": 5, "_meta": _ENVELOPE}}


async def _session_of(url: str, subject: str) -> str:
    async with httpx2.AsyncClient(timeout=30) as raw:
        return await raw_session(raw, url, _auth(subject))
