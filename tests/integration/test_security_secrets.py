"""Secrets never leak: database passwords are redacted through libpq's own
conninfo parser in every error and printed line, and the files that carry the URL are 0600 in a
0700 state dir."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from mcpsync.activities.ledger.db import DatabaseUnavailable, open_pool, redact_url
from mcpsync.worker.main.config import Config, DatabaseConfig
from mcpsync.worker.stack.common import ensure_private_dir, free_port, write_private
from mcpsync.worker.stack.running import RunningStack

SECRET = "s3cret-Pw_91"


@pytest.mark.parametrize("url", [
    f"host=127.0.0.1 port=5 dbname=x user=u password={SECRET}",
    f"host=127.0.0.1 password='{SECRET} with space' dbname=x",
    f"postgresql://u:{SECRET}@127.0.0.1:5/db",
    f"postgresql://u@127.0.0.1:5/db?sslmode=disable&password={SECRET}",
    f"postgresql://u:other{SECRET}@127.0.0.1:5/db?password={SECRET}",
    f"host=127.0.0.1 {SECRET}",  # unparseable: libpq would echo the fragment
])
def test_redact_hides_every_password_form(url: str) -> None:
    shown = redact_url(url)
    assert SECRET not in shown
    if "password" in url and "=" in url.split()[-1]:
        # Still the same connection, password aside: an operator can act on it.
        params = conninfo_to_dict(shown)
        assert params.get("host") == "127.0.0.1" and params.get("password") == "***"


def test_a_url_without_password_is_unchanged() -> None:
    for url in ("postgresql://postgres:@/postgres?host=/tmp/pg", "host=/tmp/pg dbname=x"):
        assert redact_url(url) == url


@pytest.mark.parametrize("template", [
    "host=127.0.0.1 port={port} dbname=x user=u password={pw} connect_timeout=1",
    "postgresql://u:{pw}@127.0.0.1:{port}/x",
    "postgresql://u@127.0.0.1:{port}/x?password={pw}",
    "host=127.0.0.1 port={port} {pw}",
])
async def test_unreachable_database_error_names_no_password(template: str) -> None:
    url = template.format(port=free_port(), pw=SECRET)  # nothing listens there
    with pytest.raises(DatabaseUnavailable) as err:
        await open_pool(url, timeout=2)
    assert SECRET not in str(err.value) and "PostgreSQL" in str(err.value)


def test_config_dump_redacts() -> None:
    config = Config(database=DatabaseConfig(url=f"host=db password={SECRET} dbname=x"))
    shown = repr(config.redacted())
    assert SECRET not in shown and "host=db" in shown


def test_runtime_file_and_config_are_private_in_a_private_state_dir(tmp_path: Path) -> None:
    os.umask(0o022)
    root = ensure_private_dir(tmp_path / "state")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    runtime = root / "runtime.json"
    RunningStack(temporal_address="127.0.0.1:1", namespace="default",
                database_url=f"postgresql://u:{SECRET}@db/x", ui_url="", config_path="", pid=1).save(runtime)
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o600
    assert RunningStack.load(runtime) is not None
    toml = root / "mcpsync.toml"
    toml.write_text("old, world-readable")
    os.chmod(toml, 0o644)
    write_private(toml, f'[database]\nurl = "postgresql://u:{SECRET}@db/x"\n')
    assert stat.S_IMODE(toml.stat().st_mode) == 0o600 and SECRET in toml.read_text()
    assert sorted(p.name for p in root.iterdir()) == ["mcpsync.toml", "runtime.json"], \
        "no temporary file left"
    # An existing state dir that others could list loses group/other read and write, not traversal.
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    os.chmod(wide, 0o757)
    assert stat.S_IMODE(ensure_private_dir(wide).stat().st_mode) == 0o711
