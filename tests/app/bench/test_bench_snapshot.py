"""``searchgym bench env`` reports the cost of snapshots, restores and forks."""

from __future__ import annotations

import pytest

from searchgym.app.bench.env import snapshot_us
from searchgym.app.cli import main


def test_snapshot_figures() -> None:
    figures = snapshot_us(tokens=1000, repeats=1, calls=200, num_envs=4)
    assert figures["snapshot_tokens"] > 1000  # the prompt and 1,000 policy tokens
    for key in ("snapshot_us", "restore_us", "fork_us_per_branch"):
        # A loose bound, for busy test machines: copying the corpus, the index or the whole context
        # buffer per call would cost far more.
        assert 0 < figures[key] < 500, (key, figures[key])


def test_bench_env_prints_snapshot_and_restore(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "env", "--steps", "100", "--repeats", "1", "--num-envs", "2"]) == 0
    out = capsys.readouterr().out
    assert "snapshot / restore" in out and "fork" in out
