"""The on-policy probes are sampled before the first training step: a progress bar says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from searchgym.agents.grpo.probes import onpolicy_probes
from searchgym.agents.training.policy import build_policy


@pytest.mark.parametrize("progress", [True, False])
def test_sampling_the_onpolicy_probes_shows_its_progress(
    tmp_path: Path, grpo_config: Callable[..., Any], capsys: pytest.CaptureFixture[str], progress: bool
) -> None:
    cfg = grpo_config(
        tmp_path,
        onpolicy_probe_size=2,
        onpolicy_probe_episodes=4,
        max_turns=2,
        max_turn_tokens=6,
        progress=progress,
    )
    policy, _ = build_policy(cfg.model)
    probes, summary = onpolicy_probes(cfg.probes, cfg.env, policy, progress=cfg.run.progress)
    assert set(probes) == {"train", "heldout"} and summary["episodes"] == 4
    err = capsys.readouterr().err
    shown = "on-policy probe (train)" in err and "on-policy probe (heldout)" in err
    assert shown == progress, err
    if progress:
        assert "4/4" in err and "correct found" in err
