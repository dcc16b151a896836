"""What ``mcpsync serve`` says about a version, on the real stack (Temporal, PostgreSQL, the fixture
upstream, serve over streamable HTTP): ``annotations.lastModified`` moves exactly when a version is
accepted; the digest rule as docs/serve.md writes it, in Python and in JavaScript taken from the
page, matches every served digest; a guardrail-rejected version is announced and its read refused
with the reason; ``resources/templates/list`` answers; ``events/stream`` confirms itself at once
(docs/serve.md)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.serve import FRESHNESS_META as FRESH
from mcpsync.worker.stack import REPO_ROOT
from mcpsync.workflows.digest import ContentPart, content_digest
from tests.conftest import eventually, unique
from tests.e2e.serve_helpers import (
    Seed,
    ServeProcess,
    ServeStack,
    jsonrpc_result,
    raw_session,
    run_node,
    serve_client,
    serve_conf,
    serve_stack_factory,
)
from tests.e2e.test_serve import _serve_consumers_dropped, _updated  # noqa: F401  (an autouse fixture)

SERVE_DOC = REPO_ROOT / "docs" / "serve.md"


@pytest.fixture
def serve_stack(
    temporal_client: Client, ledger: Ledger, fx: FixtureProcess, database_url: str, tmp_path: Path
) -> ServeStack:
    return serve_stack_factory(temporal_client, ledger, fx, database_url, tmp_path)


def doc_block(marker: str, doc: Path = SERVE_DOC) -> str:
    """The fenced code block right after ``<!-- marker -->`` in ``doc``."""
    found = re.search(rf"<!-- {re.escape(marker)} -->\n```[a-z]*\n(.*?)\n```", doc.read_text(), re.S)
    assert found, f"no {marker} block in {doc}"
    return found.group(1)


def _parts(read: types.ReadResourceResult) -> list[dict[str, Any]]:
    return [c.model_dump(by_alias=True, exclude_none=True, exclude={"meta"}) for c in read.contents]


async def test_a_pull_only_host_sees_last_modified_move_exactly_when_a_version_is_accepted(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice = unique("alice")
    uri = f"demo://serve/{unique('pull')}.md"
    async with (
        serve_stack(Seed(alice, uri, "# pull 0")) as st,
        serve_client(st.serve.url, st.tokens[alice], "auto") as host,
    ):
        seen: list[tuple[str, str, str]] = []  # (lastModified, digest, verifiedAt) at every re-read

        async def reread() -> tuple[str, str, str]:
            (resource,) = (await host.list_resources()).resources  # never subscribes: it only pulls
            fresh = (resource.meta or {})[FRESH]
            assert resource.annotations is not None and resource.annotations.last_modified
            assert resource.annotations.last_modified == fresh["acceptedAt"]
            seen.append((resource.annotations.last_modified, fresh["digest"], fresh["verifiedAt"]))
            return seen[-1]

        async def until(what: str, done: Any) -> tuple[str, str, str]:
            return await eventually(lambda: _when(reread(), done), interval=0.02, what=what)  # type: ignore[no-any-return]

        first = await reread()
        assert first[1] == st.v1[uri]
        accepted = [st.v1[uri]]
        for n in range(1, 21):
            committed = (await fx.edit(uri, text=f"# pull {n}", mime_type="text/markdown"))["committed"]
            accepted.append(committed["digest"])
            now = await until(f"version {n}", lambda s, d=committed["digest"]: s[1] == d)
            if n % 4 == 0:  # an upstream notification without a change: an unchanged re-read
                await fx.notify(uri)
                again = await until(f"unchanged re-read {n}", lambda s, v=now[2]: s[2] != v)
                assert again[:2] == now[:2], "lastModified moved on an unchanged re-read"
        moves = [b for a, b in zip(seen, seen[1:], strict=False) if a[0] != b[0]]
        assert len(moves) == 20 and [m[1] for m in moves] == accepted[1:]
        assert all(a[1] != b[1] for a, b in zip(seen, seen[1:], strict=False) if a[0] != b[0])
        assert all(a[0] != b[0] for a, b in zip(seen, seen[1:], strict=False) if a[1] != b[1])
        # The read says the same time as the listing.
        read = await host.read_resource(uri)
        assert (read.meta or {})[FRESH]["acceptedAt"] == seen[-1][0]


async def _when(observed: Any, done: Any) -> Any:
    value = await observed
    return value if done(value) else None


async def test_the_documented_digest_rule_matches_every_served_digest(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess, tmp_path: Path
) -> None:
    alice = unique("alice")
    seeds = (
        Seed(alice, f"demo://serve/{unique('text')}.md", "# text\nwith ünïcode ✓\n"),
        Seed(alice, f"demo://serve/{unique('crlf')}.txt", "line one\r\nline two\r\n", mime_type="text/plain"),
        Seed(
            alice,
            f"demo://serve/{unique('blob')}.bin",
            blob=bytes(range(256)) * 3,
            mime_type="application/octet-stream",
        ),
    )
    namespace: dict[str, Any] = {}
    exec(doc_block("digest-python"), namespace)  # the Python reference, exactly as the page writes it
    python_digest = namespace["mcpsync_digest"]
    js = tmp_path / "digest.mjs"
    js.write_text(
        doc_block("digest-javascript") + "\n"
        "const cases = JSON.parse(process.argv[2]);\n"
        "process.stdout.write(JSON.stringify(cases.map(mcpsyncDigest)));\n"
    )

    async def js_digests(cases: list[list[dict[str, Any]]]) -> list[str]:
        proc = await run_node(str(js), json.dumps(cases))
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        return list(json.loads(out))

    async with serve_stack(*seeds) as st, serve_client(st.serve.url, st.tokens[alice], "auto") as client:
        served: list[list[dict[str, Any]]] = []
        expected: list[str] = []
        for seed in seeds:
            read = await client.read_resource(seed.uri)
            digest = (read.meta or {})[FRESH]["digest"]
            assert digest == st.v1[seed.uri]  # the upstream's committed digest
            served.append(_parts(read))
            expected.append(digest)
        assert "\r\n" in served[1][0]["text"] and "blob" in served[2][0]
        # Several parts in one result: the rule as the content store applies it (workflows/digest.py).
        multi = [served[0][0], served[2][0], {"uri": "x", "text": ""}]
        served.append(multi)
        expected.append(
            content_digest(
                [
                    ContentPart("text", served[0][0]["mimeType"], served[0][0]["text"].encode()),
                    ContentPart("blob", "application/octet-stream", base64.b64decode(served[2][0]["blob"])),
                    ContentPart("text", None, b""),
                ]
            )
        )
        assert [python_digest(parts) for parts in served] == expected
        assert await js_digests(served) == expected


async def test_a_guardrail_rejected_version_is_announced_and_the_read_says_why(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice = unique("alice")
    uri = f"demo://serve/{unique('guard')}.md"
    async with serve_stack(Seed(alice, uri, "# small"), server_options={"release_max_bytes": 2000}) as st:
        inbox: list[Any] = []
        async with (
            serve_client(st.serve.url, st.tokens[alice], "legacy", inbox) as legacy,
            serve_client(st.serve.url, st.tokens[alice], "auto") as modern,
        ):
            with pytest.warns(Warning):
                await legacy.subscribe_resource(uri)
            await eventually(
                lambda: _updated(inbox, uri) == 1, interval=0.02, what="the subscribe announcement"
            )
            async with modern.listen(resource_subscriptions=[uri]) as sub:
                await asyncio.wait_for(sub.__anext__(), 10)  # the current version, on listen
                await fx.edit(uri, text="x" * 5000, mime_type="text/markdown")
                rejected = await asyncio.wait_for(sub.__anext__(), 10)
                assert str(getattr(rejected, "uri", "")) == uri
            await eventually(
                lambda: _updated(inbox, uri) == 2, interval=0.02, what="updated on the rejection"
            )
            for client in (legacy, modern):
                with pytest.raises(MCPError) as refused:
                    await client.read_resource(uri)
                assert refused.value.code == -32003
                assert "over the 2000-byte release limit" in refused.value.message
                assert "x" * 100 not in refused.value.message + str(refused.value.data)


@asynccontextmanager
async def bare_serve(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[ServeProcess, str]]:
    """A serve process over the test's ledger with one subject and nothing subscribed (no worker:
    nothing upstream is needed), and that subject's token."""
    token = unique("tok")
    serve = await ServeProcess.start(
        serve_conf(tmp_path, database_url), {unique("alice"): token}, consumer=unique("serve")
    )
    try:
        yield serve, token
    finally:
        await serve.stop()


async def test_resources_templates_list_answers_an_empty_list(
    ledger: Ledger, database_url: str, tmp_path: Path
) -> None:
    async with bare_serve(database_url, tmp_path) as (serve, token):
        for mode in ("auto", "legacy"):
            async with serve_client(serve.url, token, mode) as client:  # type: ignore[arg-type]
                assert client.server_capabilities is not None
                assert client.server_capabilities.resources is not None
                assert (await client.list_resource_templates()).resource_templates == []


async def test_events_stream_confirms_itself_before_a_five_second_client_timeout(
    ledger: Ledger, database_url: str, tmp_path: Path
) -> None:
    """``events/stream`` with nothing pending: status, headers and a heartbeat with the cursor
    arrive at once, within httpx's default 5 s timeout (the first periodic heartbeat is 15 s away)."""
    async with bare_serve(database_url, tmp_path) as (serve, token):
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=5) as raw:
            headers["mcp-session-id"] = await raw_session(raw, serve.url, headers)
            polled = await raw.post(
                serve.url,
                headers=headers,
                json={
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "events/poll",
                    "params": {"name": "resource.changed"},
                },
            )
            cursor = jsonrpc_result(polled)["cursor"]
            body = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "events/stream",
                "params": {"name": "resource.changed", "cursor": None},
            }
            started = time.monotonic()
            first: dict[str, Any] = {}
            async with raw.stream("POST", serve.url, json=body, headers=headers) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        first = json.loads(line[5:])
                        break
            waited = time.monotonic() - started
    assert first.get("method") == "notifications/events/heartbeat", first
    assert first["params"]["cursor"] == cursor and first["params"]["_meta"]["subscriptionId"] == 3
    assert waited < 2.0, f"first message after {waited:.2f} s"
