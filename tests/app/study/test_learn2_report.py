"""LEARN-2's pre-registered criteria (searchgym/app/study/experiments/learn2.py) on hand-built summaries: G1 per seed (gain,
paired interval, McNemar), the best RL arm, G2 against continued SFT, G3's flips by kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.study.experiments import learn2 as learn2

N = 200
"""Questions per hand-built evaluation: the first N test questions of world 0."""


def summary(arm: str, seed: int, evals: dict[int, list[int]]) -> dict[str, Any]:
    steps = [1, 2]
    return {
        "arm": arm,
        "seed": seed,
        "config": {"reward": "em"},
        "steps": max(evals),
        "wall_s": 60.0,
        "curves": {"step": steps, "rollout/sampled_reward": [0.5, 0.5]}
        | {k: [0.0, 0.0] for k in learn2.learn_report.PROBES},
        "probe_step0": {k: 0.0 for k in learn2.learn_report.PROBES},
        "eval": {
            str(step): {"em": sum(v) / len(v), "questions": "", "em_by_question": "".join(map(str, v))}
            for step, v in evals.items()
        },
        "sampled_test": None,
    }


def write(folder: Path, s: dict[str, Any]) -> None:
    (folder / f"{s['arm']}_s{s['seed']}.json").write_text(json.dumps(s))


def test_paired_gain_interval_and_mcnemar_on_known_flips() -> None:
    warm = [0] * 100 + [1] * 100
    end = [1] * 40 + [0] * 60 + [1] * 95 + [0] * 5  # 40 gained, 5 lost
    got = learn2.paired(warm, end)
    assert got["mean"] == pytest.approx(35 / 200)
    assert (got["gained"], got["lost"]) == (40, 5)
    assert got["lo"] > 0 and got["p"] < 1e-6


def test_the_verdict_names_the_best_rl_arm_and_judges_it_against_sft(tmp_path: Path) -> None:
    kinds = learn2.question_kinds(N)
    bridge = [i for i, k in enumerate(kinds) if k == "bridge"]
    warm = [0] * N
    big = [1 if i in bridge[:50] else 0 for i in range(N)]  # +50 bridge questions: a gain of 0.25
    small = [1 if i in bridge[:10] else 0 for i in range(N)]  # +0.05: short of G1's +0.15
    for seed in (0, 1, 2):
        write(tmp_path, summary("control", seed, {0: warm, 40: warm}))
        write(tmp_path, summary("scst", seed, {40: big}))
        write(tmp_path, summary("grpo", seed, {40: small}))
        write(tmp_path, summary("sft", seed, {81: small}))
    text = learn2.report(tmp_path)
    assert "scst: G1 MET (3 of 3 seeds" in text
    assert "grpo: G1 NOT MET (0 of 3 seeds" in text
    assert "best RL arm: scst" in text
    assert "scst: G2 MET (3 of 3 seeds)" in text
    assert "bridge: 150 / 0 / +150" in text and "scst: G3 MET" in text


def test_a_gain_elsewhere_than_bridge_fails_g3_and_missing_seeds_stay_undecided(tmp_path: Path) -> None:
    kinds = learn2.question_kinds(N)
    attribute = [i for i, k in enumerate(kinds) if k == "attribute"]
    warm = [0] * N
    end = [1 if i in attribute[:40] else 0 for i in range(N)]
    write(tmp_path, summary("control", 0, {0: warm}))
    write(tmp_path, summary("grpo", 0, {40: end}))
    text = learn2.report(tmp_path)
    assert "grpo: G1 undecided (seeds missing) (1 of 1 seeds" in text
    assert "grpo: G3 NOT MET (bridge +0 of net +40)" in text
