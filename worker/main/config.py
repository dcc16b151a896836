"""mcpsync configuration: one TOML file, environment overrides, validated by pydantic.

Contract:
- ``load_config(path)`` returns a ``Config`` or raises ``ConfigError`` whose
  message names the file and the offending field (no traceback for the user).
- Environment overrides: ``MCPSYNC_DATABASE_URL``, ``MCPSYNC_TEMPORAL_ADDRESS``,
  ``MCPSYNC_TEMPORAL_NAMESPACE``, ``MCPSYNC_TEMPORAL_API_KEY``,
  ``MCPSYNC_TEMPORAL_TLS_CERT``/``_KEY``, ``MCPSYNC_DEPLOYMENT_NAME``, ``MCPSYNC_BUILD_ID``.
  Credentials are read, never printed: ``Config.redacted()`` is what may be shown.
- ``[temporal] workflow_runner`` ("unsandboxed" by default, or "sandboxed") is how the main worker
  runs workflow code (docs/decisions/0004-workflow-sandbox.md).
- Worker Deployment Versioning is off unless ``[temporal] deployment_name`` and ``build_id``
  are both set (docs/upgrades.md); one without the other is a configuration error.
- Each server is opened once per listed subject; a subject's credentials come from
  the environment variable its ``token_env`` names (bearer token for HTTP; for
  stdio the variable is passed to the child).
"""

from __future__ import annotations

import os
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["Config", "ConfigError", "DatabaseConfig", "MetricsConfig", "RetentionConfig", "ServerConfig",
           "TemporalConfig", "WorkflowRunnerKind", "load_config"]


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkflowRunnerKind(StrEnum):
    """How the main worker runs workflow code (docs/decisions/0004-workflow-sandbox.md)."""

    SANDBOXED = "sandboxed"  # the SDK's sandbox: every call checked at run time, per-run cost
    UNSANDBOXED = "unsandboxed"  # plain interpreter; determinism guarded by replay and test_layers


class TemporalConfig(_Model):
    address: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "mcpsync"
    tls_cert: str | None = None  # path
    tls_key: str | None = None  # path
    api_key_env: str | None = None  # name of the env var holding a Temporal Cloud API key
    ui_url: str | None = None
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    # Workflows kept in the worker's memory between tasks: far fewer than the subscriptions a worker
    # hosts (docs/deploy.md, "Workflow cache"). A subscription whose safety reads the ledger
    # schedules wakes only for a change and its watchdog's look (four a day); evicted, it replays its
    # history (at most max_history_events) at its next wake. Size it for the runs that wake often:
    # changing and polling subscriptions, and runs still on 0.2.0's per-period timers.
    max_cached_workflows: int = Field(default=5000, ge=0)
    # How long a workflow task waits on the sticky queue of the main worker that has the run cached
    # before it goes back to the shared task queue (the SDK's default, 10 s): the runs of a main
    # worker that died wait this long before another main replays them.
    sticky_queue_timeout_seconds: float = Field(default=10.0, gt=0)
    # The main worker's workflow runner (docs/decisions/0004-workflow-sandbox.md): unsandboxed costs a
    # subscription's start about a quarter less of the worker's CPU; CI replays in the sandbox.
    workflow_runner: WorkflowRunnerKind = WorkflowRunnerKind.UNSANDBOXED
    # Worker Deployment Versioning (docs/upgrades.md): the main worker polls as build ``build_id``
    # of deployment ``deployment_name``; workflows stay pinned to the build that started them and
    # move to the deployment's current build at their next continue-as-new. Both None: unversioned.
    deployment_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,200}$")
    build_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.+-]{1,200}$")

    @model_validator(mode="after")
    def _deployment_complete(self) -> TemporalConfig:
        if (self.deployment_name is None) != (self.build_id is None):
            raise ValueError("worker versioning needs both 'deployment_name' and 'build_id' (or neither)")
        return self

    @property
    def versioned(self) -> bool:
        """True when the main worker runs under Worker Deployment Versioning."""
        return self.deployment_name is not None and self.build_id is not None


class DatabaseConfig(_Model):
    url: str | None = None  # None: embedded PostgreSQL under the state dir


def redact_http_url(url: str) -> str:
    """``url`` with a ``user:password@`` password and every query value replaced by ``***``; the
    scheme, host, port and path stay (they say which server). Not a URL at all: not shown."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostport = netloc.rpartition("@")
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
        query = urlencode([(k, "***") for k, _ in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
        return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=""))
    except ValueError:
        return "(not a URL, not shown)"


class ServerConfig(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    transport: Literal["stdio", "http"]
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    edition: Literal["2025-11-25", "2026-07-28", "auto"] = "2025-11-25"
    subjects: list[str] = Field(default_factory=lambda: ["anonymous"], min_length=1)
    token_env: dict[str, str] = Field(default_factory=dict)  # subject -> env var with its credential
    catalog: bool = True  # run a CatalogWorkflow (A/B reconciliation) per subject of this server
    lease_seconds: float = Field(default=15.0, gt=0)  # ingress ownership of (subject, server); handoff bound
    ping_interval_seconds: float = Field(default=5.0, gt=0)
    ping_timeout_seconds: float = Field(default=5.0, gt=0)
    read_timeout_seconds: float = Field(default=30.0, gt=0)
    max_content_bytes: int = Field(default=32 * 1024 * 1024, gt=0)  # larger reads are malformed input
    # Distinct notifications of one session waiting to be routed (signalled). One more is a backlog
    # overflow: the listen stream that carried it is lost (a gap, docs/caching.md), the session is
    # replaced and every subscription of it re-reads. Bounds memory against a flooding server.
    max_pending_notifications: int = Field(default=4096, ge=1)
    # Reads at the ingress (docs/architecture.md): a notified change is read right here (one read
    # cycle, no Temporal hop) and reported to the workflow; off, every change is signalled for the
    # workflow to read. ``route_concurrency``: notifications and due rows routed (and read) at once,
    # one at a time per URI. A sweep's look feeds its due rows together, so this many of their
    # allocations and accepts share a ledger transaction (the group commit): 32 holds the look of
    # 5,000 rows at a 300 s period whole (~18 a second), and the batch size is what an idle
    # subscription's CPU follows (docs/benchmarks.md, "Idle cost"). A notified read meanwhile waits
    # behind the look's reads at the server: lower it for a server that limits concurrent requests.
    read_on_notification: bool = True
    route_concurrency: int = Field(default=32, ge=1, le=256)
    # A read at the ingress slower than this is abandoned and the workflow is signalled to read
    # (with ``read_timeout_seconds`` and retries): a slow server must not hold the routers.
    ingress_read_timeout_seconds: float = Field(default=5.0, gt=0)
    release_max_bytes: int = Field(default=1024 * 1024, gt=0)  # guardrail: largest body released to a model
    mime_allow: list[str] | None = None  # guardrail: MIME patterns released to a model (None: defaults)

    @property
    def target(self) -> str:
        """What a message names this server by: its command line (stdio), or its URL with the
        password and every query value replaced (http): a URL may carry a credential there."""
        return " ".join(self.command) if self.transport == "stdio" else redact_http_url(self.url or "")

    @model_validator(mode="after")
    def _transport_fields(self) -> ServerConfig:
        if self.transport == "stdio" and not self.command:
            raise ValueError(f"server {self.name!r}: transport 'stdio' needs 'command'")
        if self.transport == "http" and not self.url:
            raise ValueError(f"server {self.name!r}: transport 'http' needs 'url'")
        return self


class MetricsConfig(_Model):
    """``[metrics]``: Prometheus endpoint (``mcpsync.worker.observe.metrics``); absent = no endpoint."""

    port: int = Field(default=9464, ge=0, le=65535)  # 0: any free port
    host: str = "127.0.0.1"  # "0.0.0.0" to let a remote Prometheus scrape
    refresh_seconds: float = Field(default=15.0, gt=0)  # ledger-derived gauges


class RetentionConfig(_Model):
    """``[retention]``: the main worker prunes the ledger periodically
    (``mcpsync.activities.ledger.retention``);
    absent = never (run ``mcpsync prune`` yourself)."""

    keep_days: float = Field(default=7.0, ge=0)
    interval_seconds: float = Field(default=86400.0, gt=0)  # first run one interval after start
    # An outbox consumer that has not acknowledged for this long stops holding outbox rows and
    # bodies back; its next poll reports a GAP and it resyncs (docs/outbox.md).
    consumer_max_lag_days: float = Field(default=30.0, ge=0)


class Config(_Model):
    temporal: TemporalConfig = TemporalConfig()
    database: DatabaseConfig = DatabaseConfig()
    servers: list[ServerConfig] = Field(default_factory=list)
    metrics: MetricsConfig | None = None
    retention: RetentionConfig | None = None
    state_dir: str | None = None

    def server(self, name: str) -> ServerConfig:
        for s in self.servers:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.servers) or "none configured"
        raise ConfigError(f"unknown server {name!r} (known: {known})")

    def redacted(self) -> dict[str, Any]:
        data = self.model_dump()
        if data["database"]["url"]:
            from mcpsync.activities.ledger.db import redact_url

            data["database"]["url"] = redact_url(data["database"]["url"])
        return data


def _env_overrides(raw: dict[str, Any]) -> dict[str, Any]:
    temporal = dict(raw.get("temporal", {}))
    database = dict(raw.get("database", {}))
    if v := os.environ.get("MCPSYNC_TEMPORAL_ADDRESS"):
        temporal["address"] = v
    if v := os.environ.get("MCPSYNC_TEMPORAL_NAMESPACE"):
        temporal["namespace"] = v
    if v := os.environ.get("MCPSYNC_TEMPORAL_TLS_CERT"):
        temporal["tls_cert"] = v
    if v := os.environ.get("MCPSYNC_TEMPORAL_TLS_KEY"):
        temporal["tls_key"] = v
    if v := os.environ.get("MCPSYNC_DEPLOYMENT_NAME"):
        temporal["deployment_name"] = v
    if v := os.environ.get("MCPSYNC_BUILD_ID"):
        temporal["build_id"] = v
    if os.environ.get("MCPSYNC_TEMPORAL_API_KEY"):
        temporal["api_key_env"] = "MCPSYNC_TEMPORAL_API_KEY"
    if v := os.environ.get("MCPSYNC_DATABASE_URL"):
        database["url"] = v
    return {**raw, "temporal": temporal, "database": database}


def load_config(path: str | Path | None) -> Config:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {p} cannot be read: {exc.strerror}") from None
    try:
        return Config.model_validate(_env_overrides(raw))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"invalid configuration{f' in {path}' if path else ''}: {problems}") from None
