"""``<state>/runtime.json``: what ``mcpsync up`` started, for the other commands to find it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mcpsync.worker.stack.common import write_private

__all__ = ["RunningStack"]


@dataclass
class RunningStack:
    """What ``mcpsync up`` started, written to ``<state>/runtime.json`` for the other commands."""

    temporal_address: str
    namespace: str
    database_url: str
    ui_url: str
    config_path: str
    pid: int | None = None  # the ``mcpsync up`` process; the file is stale once it is gone
    ingress_identity: str | None = None  # its ingress: the lease holder name of its MCP sessions

    def save(self, path: Path) -> None:
        """0600: ``database_url`` may carry a password."""
        write_private(path, json.dumps(self.__dict__, indent=2))

    @classmethod
    def load(cls, path: Path) -> RunningStack | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def stack_alive(self) -> bool:
        """Whether the ``mcpsync up`` that wrote this file still runs (a file without a pid: assumed)."""
        if self.pid is None:
            return True
        from mcpsync.worker.stack.common import process_alive

        return process_alive(self.pid, expect_in_cmdline=("mcpsync", "mcpsync.worker.cli"))
