"""scripts/precision_check.py: the paired gain and the question-paired EM gain, on hand-built numbers, and the
whole check on a made-up run against made-up summaries."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
check = pytest.importorskip("precision_check")


def test_gain_takes_the_last_half_of_the_steps() -> None:
    arm = {1: 9.0, 2: 9.0, 3: 0.5, 4: 0.7}
    control = {1: 0.0, 2: 0.0, 3: 0.3, 4: 0.3}
    g = check.gain(arm, control, steps=4)  # d = 0.2, 0.4 over steps 3-4
    assert g["n"] == 2 and g["mean"] == pytest.approx(0.3)
    half = 1.96 * (0.02**0.5) / 2**0.5  # sd of (0.2, 0.4) is sqrt(0.02)
    assert (g["lo"], g["hi"]) == pytest.approx((0.3 - half, 0.3 + half))
    with pytest.raises(SystemExit, match="at least 2 paired steps"):
        check.gain({4: 1.0}, control, steps=4)


def test_em_gain_pairs_questions() -> None:
    assert check.em_gain([1, 1, 0, 1], [1, 1, 0, 1]) == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    g = check.em_gain([1, 1, 1, 1], [0, 1, 1, 1])
    assert g["mean"] == 0.25 and g["lo"] == 0.0 and g["hi"] <= 0.75
    with pytest.raises(SystemExit, match="must match"):
        check.em_gain([1], [1, 0])


def summary(rewards: list[float], evals: dict[str, str]) -> dict[str, Any]:
    steps = list(range(1, len(rewards) + 1))
    return {
        "steps": len(steps),
        "curves": {"step": steps, "rollout/sampled_reward": rewards},
        "eval": {k: {"em_by_question": v} for k, v in evals.items()},
    }


def test_the_check_passes_inside_the_interval_and_fails_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fp32.json").write_text(json.dumps(summary([0.5, 0.5, 0.6, 0.8], {"4": "1101"})))
    (tmp_path / "control.json").write_text(json.dumps(summary([0.5, 0.5, 0.5, 0.5], {"0": "1001"})))
    for name, late, code in (("near", [0.62, 0.78], 0), ("far", [0.9, 0.95], 1)):
        run = tmp_path / name
        run.mkdir()
        rewards = [0.5, 0.5, *late]
        (run / "metrics.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "step": t,
                        "rollout/sampled_reward": r,
                        "rollout/logp_mismatch": 0.01,
                        "train/clip_frac": 0.0,
                    }
                )
                + "\n"
                for t, r in enumerate(rewards, start=1)
            )
        )
        (run / "eval_episodes.jsonl").write_text(
            "".join(
                json.dumps({"step": 4, "question_id": f"q{i}", "em": e}) + "\n"
                for i, e in enumerate([1, 1, 1, 1])
            )
        )
        argv = [str(run), "--fp32", str(tmp_path / "fp32.json"), "--control", str(tmp_path / "control.json")]
        assert check.main([*argv, "--steps", "4", "--label", "shared-prefix"]) == code
        out = capsys.readouterr().out
        assert ("shared-prefix's mean gain lies within" in out) == (
            code == 0
        ) and "greedy test EM at step 4 vs the warm-start +0.5000" in out
        assert "shared-prefix  sampled reward" in out and "bf16" not in out
