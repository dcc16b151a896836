"""The benchmark's memory knobs: ``--max-cached-workflows`` and ``--subscription-max-history-events``."""

from __future__ import annotations

import pytest

from benchmarks.options import parse_args


def test_memory_knobs_default_to_production_and_parse() -> None:
    default = parse_args([])
    assert default.max_cached_workflows is None and default.subscription_max_history_events is None
    opts = parse_args(["--max-cached-workflows", "500", "--subscription-max-history-events", "300"])
    assert (opts.max_cached_workflows, opts.subscription_max_history_events) == (500, 300)


@pytest.mark.parametrize("argv", [["--max-cached-workflows", "0"],
                                  ["--subscription-max-history-events", "99"]])
def test_memory_knobs_refuse_values_the_worker_or_the_record_would_refuse(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "must be at least" in capsys.readouterr().err
