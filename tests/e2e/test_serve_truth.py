"""What ``mcpsync serve`` says about a version, on the real stack (Temporal, PostgreSQL, the fixture
upstream, serve over streamable HTTP): ``annotations.lastModified`` moves exactly when a version is
accepted; the digest rule as docs/serve.md writes it, in Python and in JavaScript taken from the
page, matches every served digest; a guardrail-rejected version is announced and its read refused
with the reason; every client example and host configuration of docs/serve.md runs;
``resources/templates/list`` answers; ``events/stream`` confirms itself at once (docs/serve.md).

One stack for the module (``truth``): each test has its own resources on it, so none depends on
another's edits."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.serve.server import FRESHNESS_META as FRESH
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.workflows.digest import ContentPart, content_digest
from tests import cli_process
from tests.conftest import eventually, ledger_rows, unique
from tests.e2e.conftest import SpareFixtures
from tests.e2e.serve_helpers import (
    NPM_PREFIX,
    Seed,
    Served,
    jsonrpc_result,
    raw_session,
    run_node,
    serve_client,
    serve_stack_factory,
)
from tests.e2e.test_serve import _updated

SERVE_DOC = REPO_ROOT / "docs" / "serve.md"
RELEASE_MAX_BYTES = 2000


@dataclass(frozen=True)
class Truth:
    """The module's stack: alice's resources (one or more per test), bob's guarded one."""

    st: Served
    fx: FixtureProcess
    alice: str
    bob: str
    pull: Seed
    digests: tuple[Seed, ...]
    guarded: Seed
    example: Seed

    def token(self, subject: str) -> str:
        return self.st.tokens[subject]


@pytest.fixture(scope="module")
async def truth(
    temporal_client: Client, ledger: Ledger, database_url: str, tmp_path_factory: pytest.TempPathFactory,
    spare_fixtures: SpareFixtures,
) -> AsyncIterator[Truth]:
    tmp = tmp_path_factory.mktemp("truth")
    alice, bob = unique("alice"), unique("bob")
    pull = Seed(alice, f"demo://serve/{unique('pull')}.md", "# pull 0")
    digests = (
        Seed(alice, f"demo://serve/{unique('text')}.md", "# text\nwith ünïcode ✓\n"),
        Seed(alice, f"demo://serve/{unique('crlf')}.txt", "line one\r\nline two\r\n", mime_type="text/plain"),
        Seed(
            alice,
            f"demo://serve/{unique('blob')}.bin",
            blob=bytes(range(256)) * 3,
            mime_type="application/octet-stream",
        ),
    )
    guarded = Seed(bob, f"demo://serve/{unique('guard')}.md", "# small")
    example = Seed(alice, f"demo://serve/{unique('example')}.md", "# example one")
    fx = await spare_fixtures.take()
    try:
        start = serve_stack_factory(temporal_client, ledger, fx, database_url, tmp)
        async with start(
            pull, *digests, guarded, example, server_options={"release_max_bytes": RELEASE_MAX_BYTES}
        ) as st:
            yield Truth(st, fx, alice, bob, pull, digests, guarded, example)
    finally:
        await fx.stop()
        # serve's durable consumer holds outbox retention back for the whole database
        await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name LIKE %s", "serve-%")


def doc_block(marker: str, doc: Path = SERVE_DOC) -> str:
    """The fenced code block right after ``<!-- marker -->`` in ``doc``."""
    found = re.search(rf"<!-- {re.escape(marker)} -->\n```[a-z]*\n(.*?)\n```", doc.read_text(), re.S)
    assert found, f"no {marker} block in {doc}"
    return found.group(1)


def _parts(read: types.ReadResourceResult) -> list[dict[str, Any]]:
    return [c.model_dump(by_alias=True, exclude_none=True, exclude={"meta"}) for c in read.contents]


async def _when(observed: Any, done: Any) -> Any:
    value = await observed
    return value if done(value) else None


async def test_a_pull_only_host_sees_last_modified_move_exactly_when_a_version_is_accepted(
    truth: Truth,
) -> None:
    uri = truth.pull.uri
    async with serve_client(truth.st.serve.url, truth.token(truth.alice), "auto") as host:
        seen: list[tuple[str, str, str]] = []  # (lastModified, digest, verifiedAt) at every re-read

        async def reread() -> tuple[str, str, str]:
            listed = (await host.list_resources()).resources  # never subscribes: it only pulls
            (resource,) = [r for r in listed if str(r.uri) == uri]
            fresh = (resource.meta or {})[FRESH]
            assert resource.annotations is not None and resource.annotations.last_modified
            assert resource.annotations.last_modified == fresh["acceptedAt"]
            seen.append((resource.annotations.last_modified, fresh["digest"], fresh["verifiedAt"]))
            return seen[-1]

        async def until(what: str, done: Any) -> tuple[str, str, str]:
            return await eventually(lambda: _when(reread(), done), interval=0.02, what=what)  # type: ignore[no-any-return]

        first = await reread()
        assert first[1] == truth.st.v1[uri]
        accepted = [truth.st.v1[uri]]
        for n in range(1, 21):
            committed = (await truth.fx.edit(uri, text=f"# pull {n}", mime_type="text/markdown"))["committed"]
            accepted.append(committed["digest"])
            now = await until(f"version {n}", lambda s, d=committed["digest"]: s[1] == d)
            if n % 5 == 0:  # an upstream notification without a change: an unchanged re-read
                await truth.fx.notify(uri)
                again = await until(f"unchanged re-read {n}", lambda s, v=now[2]: s[2] != v)
                assert again[:2] == now[:2], "lastModified moved on an unchanged re-read"
        pairs = list(zip(seen, seen[1:], strict=False))
        moves = [b for a, b in pairs if a[0] != b[0]]
        assert len(moves) == 20 and [m[1] for m in moves] == accepted[1:]
        assert all((a[0] != b[0]) == (a[1] != b[1]) for a, b in pairs)  # moves exactly with the version
        read = await host.read_resource(uri)  # the read says the same time as the listing
        assert (read.meta or {})[FRESH]["acceptedAt"] == seen[-1][0]


async def test_the_documented_digest_rule_matches_every_served_digest(truth: Truth, tmp_path: Path) -> None:
    namespace: dict[str, Any] = {}
    exec(doc_block("digest-python"), namespace)  # the Python reference, exactly as the page writes it
    python_digest = namespace["mcpsync_digest"]
    js = tmp_path / "digest.mjs"
    js.write_text(
        doc_block("digest-javascript") + "\n"
        "const cases = JSON.parse(process.argv[2]);\n"
        "process.stdout.write(JSON.stringify(cases.map(mcpsyncDigest)));\n"
    )
    async with serve_client(truth.st.serve.url, truth.token(truth.alice), "auto") as client:
        served: list[list[dict[str, Any]]] = []
        expected: list[str] = []
        for seed in truth.digests:
            read = await client.read_resource(seed.uri)
            digest = (read.meta or {})[FRESH]["digest"]
            assert digest == truth.st.v1[seed.uri]  # the upstream's committed digest
            served.append(_parts(read))
            expected.append(digest)
    assert "\r\n" in served[1][0]["text"] and "blob" in served[2][0]
    # Several parts in one result: the rule as the content store applies it (workflows/digest.py).
    served.append([served[0][0], served[2][0], {"uri": "x", "text": ""}])
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
    proc = await run_node(str(js), json.dumps(served))
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out) == expected


async def test_a_guardrail_rejected_version_is_announced_and_the_read_says_why(truth: Truth) -> None:
    uri, url, token = truth.guarded.uri, truth.st.serve.url, truth.token(truth.bob)
    inbox: list[Any] = []
    async with (
        serve_client(url, token, "legacy", inbox) as legacy,
        serve_client(url, token, "auto") as modern,
    ):
        with pytest.warns(Warning):
            await legacy.subscribe_resource(uri)
        await eventually(lambda: _updated(inbox, uri) == 1, interval=0.02, what="the subscribe announcement")
        async with modern.listen(resource_subscriptions=[uri]) as sub:
            await asyncio.wait_for(sub.__anext__(), 10)  # the current version, on listen
            await truth.fx.edit(uri, text="x" * (RELEASE_MAX_BYTES * 2), mime_type="text/markdown")
            rejected = await asyncio.wait_for(sub.__anext__(), 10)
            assert str(getattr(rejected, "uri", "")) == uri
        await eventually(lambda: _updated(inbox, uri) == 2, interval=0.02, what="updated on the rejection")
        for client in (legacy, modern):
            with pytest.raises(MCPError) as refused:
                await client.read_resource(uri)
            assert refused.value.code == -32003
            assert f"over the {RELEASE_MAX_BYTES}-byte release limit" in refused.value.message
            assert "x" * 100 not in refused.value.message + str(refused.value.data)


async def _run(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_every_client_example_in_the_docs_runs(truth: Truth, tmp_path: Path) -> None:
    uri, st = truth.example.uri, truth.st
    env = {
        **cli_process.without_database_url(),
        "MCPSYNC_URL": st.serve.url,
        "MCPSYNC_TOKEN": truth.token(truth.alice),
    }
    python_example = tmp_path / "example.py"
    python_example.write_text(doc_block("example-python"))
    # Next to the installed SDK, where `npm install @modelcontextprotocol/sdk` would put it.
    ts_example = NPM_PREFIX / f"example-{unique('ts')}.mjs"
    ts_example.write_text(doc_block("example-typescript"))
    inspector = doc_block("example-inspector")
    assert inspector in (REPO_ROOT / "README.md").read_text()  # the README's command, as written

    async def http_host() -> list[str]:
        config = json.loads(doc_block("host-http"))["mcpServers"]["mcpsync"]
        url = config["url"].replace("http://127.0.0.1:8765/mcp", st.serve.url)
        headers = {k: Template(v).substitute(env) for k, v in config["headers"].items()}  # as a host expands
        async with (
            create_mcp_http_client(headers=headers) as hc,
            McpClient(streamable_http_client(url, http_client=hc), cache=None) as client,  # type: ignore[arg-type]
        ):
            return [str(r.uri) for r in (await client.list_resources()).resources]

    async def stdio_host() -> str:
        config = json.loads(doc_block("host-stdio"))["mcpServers"]["mcpsync"]
        args = [
            str(st.conf) if a == "/etc/mcpsync/mcpsync.toml" else truth.alice if a == "alice" else a
            for a in config["args"]
        ]
        path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        command = shutil.which(config["command"], path=path)
        assert command is not None, "the installed mcpsync command"
        params = StdioServerParameters(command=command, args=args, env={**env, "PATH": path})
        async with McpClient(params, cache=None) as client:  # type: ignore[arg-type]
            part = (await client.read_resource(uri)).contents[0]
            return part.text if isinstance(part, types.TextResourceContents) else ""

    try:
        python_run, ts_run, inspector_run, listed, stdio_text = await asyncio.gather(
            _run(sys.executable, str(python_example), env=env),
            _run("node", str(ts_example), env=env),
            _run("bash", "-c", inspector, env=env),
            http_host(),
            stdio_host(),
        )
    finally:
        ts_example.unlink()
    expected = {"uri": uri, "digest": st.v1[uri], "fresh": True, "text": "# example one"}
    for rc, out, err in (python_run, ts_run):
        assert rc == 0, err
        (line,) = [x for x in map(json.loads, out.splitlines()) if x["uri"] == uri]
        assert {k: line[k] for k in expected} == expected and line["lastModified"], line
    rc, out, err = inspector_run
    assert rc == 0 and uri in out and st.v1[uri] in out, out + err
    assert uri in listed and stdio_text == "# example one"


async def test_resources_templates_list_answers_an_empty_list(truth: Truth) -> None:
    for mode in ("auto", "legacy"):
        async with serve_client(truth.st.serve.url, truth.token(truth.alice), mode) as client:  # type: ignore[arg-type]
            assert client.server_capabilities is not None and client.server_capabilities.resources is not None
            assert (await client.list_resource_templates()).resource_templates == []


async def test_events_stream_confirms_itself_before_a_five_second_client_timeout(truth: Truth) -> None:
    """``events/stream`` with nothing pending: status, headers and a heartbeat with the cursor arrive
    at once, within httpx's default 5 s timeout (the first periodic heartbeat is 15 s away)."""
    url = truth.st.serve.url
    headers = {
        "Authorization": f"Bearer {truth.token(truth.alice)}",
        "Accept": "application/json, text/event-stream",
    }
    async with httpx2.AsyncClient(timeout=5) as raw:
        headers["mcp-session-id"] = await raw_session(raw, url, headers)
        polled = await raw.post(
            url,
            headers=headers,
            json={"jsonrpc": "2.0", "id": 2, "method": "events/poll", "params": {"name": "resource.changed"}},
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
        async with raw.stream("POST", url, json=body, headers=headers) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    first = json.loads(line[5:])
                    break
        waited = time.monotonic() - started
        assert first.get("method") == "notifications/events/heartbeat", first
        assert first["params"]["_meta"]["subscriptionId"] == 3
        # Cursors are sealed (two of one position differ): the heartbeat's names the poll's position,
        # so polling from each returns the same (nothing new).
        again = []
        for i, from_cursor in enumerate((cursor, first["params"]["cursor"])):
            params = {"name": "resource.changed", "cursor": from_cursor}
            poll = {"jsonrpc": "2.0", "id": 4 + i, "method": "events/poll", "params": params}
            reply = await raw.post(url, headers=headers, json=poll)
            again.append(jsonrpc_result(reply))
        assert [r["events"] for r in again] == [[], []] and not any(r.get("truncated") for r in again), again
    assert waited < 2.0, f"first message after {waited:.2f} s"
