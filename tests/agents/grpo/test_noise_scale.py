"""The gradient noise scale: its two estimators on hand-computed cases, on a problem whose noise scale is
known in closed form, and ``searchgym bench gns`` end to end."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.noise import (  # noqa: E402
    GradientMoments,
    MicroGradients,
    noise_scale_from_samples,
    noise_scale_two_batch,
)
from searchgym.app.cli import main  # noqa: E402

DIM, SIGMA = 50, 1.0
MEAN = torch.full((DIM,), math.sqrt(2.5 / DIM))
NOISE_SCALE = DIM * SIGMA**2 / 2.5
"""Gradient samples x ~ N(MEAN, SIGMA² I): tr Σ = DIM σ² = 50 and |E g|² = 2.5, so B_noise = 20 exactly."""


def samples(n: int, seed: int = 0) -> torch.Tensor:
    return MEAN + SIGMA * torch.randn(n, DIM, generator=torch.Generator().manual_seed(seed))


def test_hand_computed_estimates() -> None:
    # Samples (1, 0) and (3, 0): mean (2, 0), tr Σ = (1 + 1) / 1 = 2, |E g|² = 4 - 2 / 2 = 3.
    out = noise_scale_from_samples(torch.tensor([[1.0, 0.0], [3.0, 0.0]]))
    assert out == pytest.approx({"grad_sq": 3.0, "trace_cov": 2.0, "noise_scale": 2.0 / 3.0})
    # E|g_1|² = 5, E|g_2|² = 3: |G|² = (2·3 - 1·5) / 1 = 1, tr Σ = (5 - 3) / (1 - 1/2) = 4.
    assert noise_scale_two_batch(5.0, 3.0, 1.0, 2.0) == pytest.approx(
        {"grad_sq": 1.0, "trace_cov": 4.0, "noise_scale": 4.0}
    )
    # No resolvable signal: the noise scale is infinite, not negative.
    assert noise_scale_from_samples(torch.tensor([[1.0], [-1.0]]))["noise_scale"] == math.inf
    with pytest.raises(ValueError, match="at least 2"):
        noise_scale_from_samples(torch.ones(1, 3))
    with pytest.raises(ValueError, match="b_small < b_big"):
        noise_scale_two_batch(1.0, 1.0, 2.0, 2.0)


def test_per_sample_estimate_recovers_the_closed_form_noise_scale() -> None:
    moments = GradientMoments()
    for g in samples(20_000):
        moments.add(g)
    out = moments.noise_scale()
    assert out["trace_cov"] == pytest.approx(DIM * SIGMA**2, rel=0.05)
    assert out["grad_sq"] == pytest.approx(2.5, rel=0.1)
    assert out["noise_scale"] == pytest.approx(NOISE_SCALE, rel=0.1)


def test_two_batch_estimate_from_accumulated_micro_batches_recovers_it() -> None:
    """A linear "model" w whose micro-batch loss is -w·(mean of its samples) × token share: each backward
    adds that share of the micro-batch's mean gradient, as the trainer's token-mean loss does."""
    w = torch.zeros(DIM, requires_grad=True)
    data = samples(24_000, seed=1)
    figures: dict[str, list[float]] = {}
    for update in data.split(8):  # updates of 4 micro-batches of 2 "groups" (group_size 1)
        w.grad = None
        micro = MicroGradients([w], group_size=1)
        for part in update.split(2):
            share = len(part) / len(update)
            (-(w * part.mean(dim=0)).sum() * share).backward()
            micro.add(len(part), share)
        for key, value in micro.sizes().items():
            figures.setdefault(key, []).append(value)
    mean = {k: sum(v) / len(v) for k, v in figures.items()}
    assert (mean["gns_small_groups"], mean["gns_big_groups"]) == (2.0, 8.0)
    out = noise_scale_two_batch(mean["gns_small_sq"], mean["gns_big_sq"], 2.0, 8.0)
    assert out["noise_scale"] == pytest.approx(NOISE_SCALE, rel=0.1)


def test_bench_gns_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "gns", "--tiny-layers", "1", "--tiny-hidden", "32", "--max-turn-tokens", "8"]
    args += ["--groups", "4", "--group-size", "2", "--minibatch-size", "4", "--questions-per-step", "2"]
    assert main([*args, "--threads", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    for key in ("grad_sq", "trace_cov", "noise_scale_groups", "noise_scale_rollouts", "informative_frac"):
        assert key in figures
    assert figures["groups"] == 4 and figures["rollouts"] == 8 and figures["minibatch_groups"] == 2.0
    assert figures["noise_scale_rollouts"] == pytest.approx(2 * figures["noise_scale_groups"])
    assert "SNR" in figures["recommendation"] or "no signal" in figures["recommendation"]


def test_bench_gns_without_any_reward_signal_says_so_and_shows_the_gradients_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An untrained model never answers right: every group is all-wrong, and the line says there is no signal
    (not "SNR 133, more signal than noise", which measures the entropy bonus); a timer runs meanwhile."""
    args = ["bench", "gns", "--tiny-layers", "1", "--tiny-hidden", "32", "--max-turn-tokens", "8"]
    args += ["--groups", "3", "--group-size", "2", "--minibatch-size", "4", "--questions-per-step", "2"]
    assert main([*args, "--threads", "1"]) == 0
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert "informative_frac       0" in out and "mean_reward            0" in out
    assert out[-1].startswith(
        "no reward signal: every one of the 3 groups got one reward for all its responses"
    )
    assert "more signal than noise" not in captured.out
    assert "computing one gradient per group" in captured.err and "gradients: " in captured.err
