"""The ``mcpsync`` console script's entry point: Ctrl-C while the CLI starts is a quiet exit 130.

Contract: ``main`` installs ``quiet_interrupt`` before importing the CLI (its imports take most of
a second, and a Ctrl-C then would print a ``KeyboardInterrupt`` traceback), then runs
``mcpsync.worker.cli.root.main``. This module imports nothing but ``os`` and ``signal``. The command's
event loop replaces the handler once the command runs (a follower then stops cleanly, exit 0).
"""

from __future__ import annotations

import os
import signal

__all__ = ["main", "quiet_interrupt"]

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process a Ctrl-C ended


def _exit_interrupted(signum: int, frame: object) -> None:
    os._exit(INTERRUPTED)


def quiet_interrupt() -> None:
    """From now until the command's event loop runs, SIGINT exits 130 without a traceback."""
    signal.signal(signal.SIGINT, _exit_interrupted)


def main() -> None:
    quiet_interrupt()
    from mcpsync.worker.cli.root import main as cli_main

    cli_main()
