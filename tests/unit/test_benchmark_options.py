"""The benchmark's options: the memory knobs (``--max-cached-workflows``,
``--subscription-max-history-events``), ``--scale-only`` and ``--history-sample``."""

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


def test_scale_only_runs_no_staleness_profiles_and_samples_histories() -> None:
    full, scale = parse_args([]), parse_args(["--scale-only", "--subscriptions", "5000"])
    assert (full.scale_only, full.staleness_subscriptions, full.history_sample) == (False, 4, 1000)
    assert (scale.scale_only, scale.staleness_subscriptions, scale.subscriptions) == (True, 0, [5000])
    assert parse_args(["--history-sample", "50"]).history_sample == 50


@pytest.mark.parametrize(("argv", "message"), [
    (["--scale-only", "--idle-window", "0"], "needs an idle window"),
    (["--scale-only", "--series", "100,1000"], "one N"),
    (["--scale-only", "--ingress-scale", "1,50"], "different runs"),
    (["--scale-only", "--layout", "in-process"], "--layout split"),
    (["--scale-only", "--staleness-subscriptions", "2"], "no staleness profiles"),
    (["--staleness-subscriptions", "-1"], "at least 0"),
    (["--history-sample", "0"], "at least 1"),
    (["--history-sample", "-5"], "at least 1"),
])
def test_scale_only_and_the_history_sample_refuse_what_they_would_ignore_or_break(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
