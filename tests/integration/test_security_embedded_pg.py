"""Embedded PostgreSQL stays private: a data dir whose socket path would not fit
is refused before anything starts (no shared 0777 socket fallback), and as root the parents of
the data dir gain at most traverse (g+x, o+x), never a listing."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import psycopg
import pytest

from mcpsync.worker.stack.common import StackError
from mcpsync.worker.stack.postgres import SOCKET_PATH_MAX, EmbeddedPostgres, _traversable_prefix


def _runtime_dirs() -> set[Path]:
    return {p for p in Path("/tmp").glob("runtime-*")} | {p for base in Path("/tmp").glob("runtime-*")
                                                           for p in base.iterdir()}


async def test_a_state_dir_too_long_for_the_socket_is_refused(tmp_path: Path) -> None:
    state = tmp_path / ("s" * max(1, SOCKET_PATH_MAX - len(str(tmp_path))))
    before = _runtime_dirs()
    with pytest.raises(StackError) as err:
        await EmbeddedPostgres.start(state)
    message = str(err.value)
    assert "refused" in message and "MCPSYNC_STATE_DIR" in message and "\n" not in message
    assert not (state / "pgdata").exists(), "nothing created, nothing started"
    assert _runtime_dirs() == before, "no socket dir under /tmp/runtime-*"


@pytest.mark.skipif(os.geteuid() != 0, reason="the wheel changes permissions only when run as root")
async def test_as_root_parents_gain_traverse_only(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    outer.mkdir(mode=0o700)
    os.chmod(outer, 0o700)
    state = outer / "st"
    pg = await EmbeddedPostgres.start(state, database="priv")
    try:
        with psycopg.connect(pg.url, connect_timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert stat.S_IMODE(outer.stat().st_mode) == 0o711, "traverse for the server's user, no listing"
        assert stat.S_IMODE(state.stat().st_mode) & 0o066 == 0, "the state dir lists to nobody else"
        socket_dir = Path(pg.url.partition("host=")[2].split("&")[0])
        assert socket_dir == pg.pgdata and stat.S_IMODE(socket_dir.stat().st_mode) & 0o077 == 0
    finally:
        await pg.stop()


def test_making_a_parent_traversable_is_info_not_a_warning(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    # Each new state dir as root makes parents traversable: expected, so INFO (-v), never a WARNING
    # on every 'mcpsync up'.
    outer = tmp_path / "outer"
    outer.mkdir(mode=0o700)
    os.chmod(outer, 0o700)
    (outer / "st").mkdir()
    os.chmod(outer / "st", 0o711)
    caplog.set_level(logging.DEBUG, logger="mcpsync.stack")
    _traversable_prefix(outer / "st" / "pgdata")
    assert stat.S_IMODE(outer.stat().st_mode) == 0o711
    changes = [r for r in caplog.records if "traversable" in r.getMessage()]
    assert any(f"made {outer} traversable" in r.getMessage() for r in changes)
    assert {r.levelname for r in changes} == {"INFO"}
