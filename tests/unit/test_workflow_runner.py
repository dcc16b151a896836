"""``[temporal] workflow_runner``: the TOML value picks the main worker's runner; anything else is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from mcpsync.worker.main.config import ConfigError, WorkflowRunnerKind, load_config
from mcpsync.worker.main.worker import workflow_runner


def _config(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "mcpsync.toml"
    path.write_text(f"[temporal]\n{line}\n")
    return path


@pytest.mark.parametrize(("value", "runner_type"), [("sandboxed", SandboxedWorkflowRunner),
                                                    ("unsandboxed", UnsandboxedWorkflowRunner)])
def test_the_toml_value_picks_the_runner(tmp_path: Path, value: str, runner_type: type) -> None:
    kind = load_config(_config(tmp_path, f'workflow_runner = "{value}"')).temporal.workflow_runner
    assert kind is WorkflowRunnerKind(value)
    assert type(workflow_runner(kind)) is runner_type


def test_an_unknown_runner_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="temporal.workflow_runner"):
        load_config(_config(tmp_path, 'workflow_runner = "threads"'))


def test_the_sandboxed_runner_shares_the_workers_imports() -> None:
    # Re-importing workflows/ into every new run costs a start tens of milliseconds of CPU.
    runner = workflow_runner(WorkflowRunnerKind.SANDBOXED)
    assert isinstance(runner, SandboxedWorkflowRunner)
    assert runner.restrictions.passthrough_all_modules
