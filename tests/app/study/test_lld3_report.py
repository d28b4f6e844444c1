"""LLD-3's pre-registered definitions (searchgym/app/study/experiments/lld3.py) on hand-built summaries: learned, the
collapse step, the precursors and their lead, the phase windows, and the verdict per criterion."""

from __future__ import annotations

from typing import Any

import pytest

from searchgym.app.study.experiments import lld3 as lld3


def summary(arm: str, seed: int, reward: list[float], **curves: list[float]) -> dict[str, Any]:
    steps = list(range(1, len(reward) + 1))
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(steps),
        "wall_s": 60.0,
        "curves": {"step": steps, "rollout/sampled_reward": reward}
        | {k: [1.0] * len(steps) for k in ("rollout/answered", "rollout/searches", "train/grad_norm")}
        | {"lld/delta_adv_pos": [0.0] * len(steps)}
        | curves,
        "probe_step0": {lld3.HELDOUT: -1.0},
        "eval": {},
        "sampled_test": None,
    }


def test_learned_needs_the_gain_and_an_interval_above_zero() -> None:
    d = {t: 0.0 for t in range(1, 101)}
    assert lld3.learned(d)["met"] is False
    d.update({t: 0.03 + (0.01 if t % 2 else -0.01) for t in range(21, 51)})
    got = lld3.learned(d)
    assert got["mean"] == pytest.approx(0.03) and got["lo"] > 0 and got["met"] is True
    d.update({t: 0.015 for t in range(21, 51)})  # clearly above 0, below the +0.02 asked
    assert lld3.learned(d)["met"] is False


def test_collapse_is_the_first_full_trailing_window_at_or_below_the_threshold() -> None:
    d = {t: 0.05 for t in range(1, 41)} | {t: -0.1 for t in range(41, 61)}
    # D_t = (0.05 * (50 - t) - 0.1 * (t - 40)) / 10 <= -0.03  <=>  t >= 45.33
    assert lld3.collapse_step(d) == 46
    assert lld3.collapse_step({t: -0.02 for t in range(1, 101)}) is None  # never as low as -0.03
    assert lld3.collapse_step({t: -0.5 for t in range(1, 10)}) is None  # no full window yet


def test_probe_precursor_is_a_drawdown_from_the_running_best() -> None:
    s = summary("grpo", 0, [0.0] * 30)
    s["probe_step0"][lld3.HELDOUT] = -1.0
    s["curves"]["step"] = [5, 10, 15, 20, 25]
    s["curves"][lld3.HELDOUT] = [-0.97, -0.90, -0.94, -0.951, -1.2]  # best -0.90 at 10; 0.05 below at 20
    assert lld3.probe_onset(s) == 20
    s["curves"][lld3.HELDOUT] = [-1.01, -1.02, -1.03, -1.04, -1.049]  # slides, never 0.05 below -1.0
    assert lld3.probe_onset(s) is None


def test_ledger_precursor_and_lead() -> None:
    s = summary("grpo", 0, [0.0] * 5, **{"lld/ledger_delta": [0.0, -0.05, -0.1, -0.3, None]})
    assert lld3.ledger_onset(s) == 3


def test_phase_windows_and_their_rule() -> None:
    n = 80
    adv = [0.01] * 30 + [0.0] * 20 + [-0.02] * 30
    grad = [1.0] * 60 + [3.0] * 20
    s = summary("grpo", 0, [0.0] * n, **{"lld/delta_adv_pos": adv, "train/grad_norm": grad})
    p = lld3.phases(s, collapse=61)  # W2 = 46..60, W3 = 61..75
    assert p["lld/delta_adv_pos"][0] == pytest.approx(0.01)
    assert p["lld/delta_adv_pos"][1] == pytest.approx((0.0 * 5 - 0.02 * 10) / 15)
    assert p["lld/delta_adv_pos"][2] == pytest.approx(-0.02)
    assert p["train/grad_norm"][1:] == [1.0, 3.0]
    assert lld3.phases_hold(p)
    assert not lld3.phases_hold(
        {"lld/delta_adv_pos": [0.0, -0.01, -0.02], "train/grad_norm": [1.0, 2.0, 1.0]}
    )


def _arm(arm: str, seed: int, reward: list[float], final: float) -> dict[str, Any]:
    s = summary(
        arm, seed, reward, **{lld3.HELDOUT: [-1.0] * len(reward), "lld/ledger_delta": [0.0] * len(reward)}
    )
    s["eval"] = {str(len(reward)): {"em": final}}
    return s


def test_verdict_reads_each_criterion_from_the_seeds() -> None:
    flat = [0.4] * 100
    up_down = [0.4] * 20 + [0.45] * 30 + [0.30] * 50  # learns over 21-50, then falls under the control
    by_arm: dict[str, dict[int, dict[str, Any]]] = {"control": {}, "grpo": {}, "llds": {}}
    for seed in range(3):
        by_arm["control"][seed] = _arm("control", seed, flat, 0.6)
        by_arm["grpo"][seed] = _arm("grpo", seed, up_down, 0.4)
        by_arm["llds"][seed] = _arm("llds", seed, [0.4] * 20 + [0.45] * 80, 0.65)
    rows = lld3.seed_rows(by_arm)
    # D_t = (0.05 * (60 - t) - 0.1 * (t - 50)) / 10 <= -0.03  <=>  t >= 55.33
    assert rows["grpo"][0]["collapse"] == 56 and rows["llds"][0]["collapse"] is None
    lines = lld3.verdict(rows)
    assert lines[0].startswith("C1 learn, then collapse: MET")
    assert "C2" in lines[1] and "NOT MET" in lines[1]  # no probe or ledger onset at all
    assert next(x for x in lines if x.startswith("C3 llds")).startswith("C3 llds: MET")
    assert "C3 ledger: undecided" in next(x for x in lines if x.startswith("C3 ledger"))


def test_criteria_wait_for_the_missing_seeds() -> None:
    up_down = [0.4] * 20 + [0.45] * 30 + [0.30] * 50
    by_arm = {
        "control": {0: _arm("control", 0, [0.4] * 100, 0.6)},
        "grpo": {0: _arm("grpo", 0, up_down, 0.4)},
    }
    lines = lld3.verdict(lld3.seed_rows(by_arm))
    assert "C1 learn, then collapse: undecided" in lines[0]
    assert "not applicable" in lines[1]
    assert next(x for x in lines if x.startswith("C4")).startswith("C4 the phases: undecided")
