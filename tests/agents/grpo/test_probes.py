"""The on-policy probes are sampled before the first training step: a progress bar says so, and a run
shorter than its probes says so at its start."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from searchgym.agents.grpo.config import ProbesConfig
from searchgym.agents.grpo.probes import onpolicy_probe_note, onpolicy_probes
from searchgym.agents.training.policy import config_policy


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
    policy, _ = config_policy(cfg)  # stops each turn at the env's max_turn_tokens, as the trainer's does
    probes, summary = onpolicy_probes(cfg.probes, cfg.env, policy, progress=cfg.run.progress)
    assert set(probes) == {"train", "heldout"} and summary["episodes"] == 4
    err = capsys.readouterr().err
    shown = "on-policy probe (train)" in err and "on-policy probe (heldout)" in err
    assert shown == progress, err
    if progress:  # the bar counts the 4 episodes (tqdm may skip its later frames, postfix included)
        assert "/4 [" in err and "ep/s" in err


def test_a_run_shorter_than_its_probes_is_told_at_its_start() -> None:
    # The defaults: 64 correct responses sought in up to 256 episodes on each of two splits.
    note = onpolicy_probe_note(ProbesConfig(), run_episodes=2 * 4 * 5)
    assert note == (
        "searchgym: before step 1, the on-policy probes sample up to 512 episodes (256 on the training split "
        "and 256 on 'validation', until 64 correct ones each), more than the 40 this run trains on; "
        "--onpolicy-probe-episodes N caps them, --onpolicy-probe-size 0 turns them off"
    )
    assert onpolicy_probe_note(ProbesConfig(), run_episodes=100 * 10 * 5) is None  # the default run
    assert onpolicy_probe_note(ProbesConfig(onpolicy_probe_size=0), run_episodes=1) is None
    assert "up to 16 episodes" in (onpolicy_probe_note(ProbesConfig(onpolicy_probe_episodes=8), 10) or "")


def test_the_trainer_prints_the_note_before_sampling(
    tmp_path: Path, grpo_config: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.agents.grpo.trainer import GRPOTrainer

    sizes = {"max_turns": 2, "max_turn_tokens": 6, "questions_per_step": 2, "group_size": 2}
    sizes |= {"minibatch_size": 2, "probe_size": 0, "ledger_size": 0, "kl_coef": 0.0, "save_every": 0}
    cfg = grpo_config(tmp_path, onpolicy_probe_size=2, onpolicy_probe_episodes=4, **sizes)
    GRPOTrainer(cfg)
    err = capsys.readouterr().err
    assert onpolicy_probe_note(cfg.probes, 1 * 2 * 2) in err
    GRPOTrainer(grpo_config(tmp_path / "none", onpolicy_probe_size=0, **sizes))
    assert "on-policy probes sample" not in capsys.readouterr().err
