"""A loss term of the user's own (``--loss-term module:function``): loaded from the current directory, seen
in the loss with its coefficient, split over micro-batches by token share, and logged under
``train/loss_term``; a target that cannot be used is one clear line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.advantages import group_advantages  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.loss_term import load_loss_term  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.agents.training.metrics import read_metrics  # noqa: E402
from searchgym.app.cli import main  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402

TINY: dict[str, Any] = {
    "max_turns": 2,
    "max_turn_tokens": 8,
    "questions_per_step": 2,
    "group_size": 2,
    "minibatch_size": 4,
    "onpolicy_probe_size": 0,
    "probe_size": 0,
    "ledger_size": 0,
}

TERMS = '''
import torch

def negative_mean_logp(inputs):
    """Minus the mean log-likelihood of the policy's tokens (a pull towards the sampled tokens)."""
    mask = inputs.loss_mask
    value = -(inputs.logp * mask).sum() / mask.sum()
    return value, {"tokens": float(mask.sum()), "step": inputs.step}

def one(inputs):
    return inputs.logp.new_tensor(1.0), {}

def vector(inputs):
    return inputs.logp.sum(dim=1), {}

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``toyterms.py`` in a working directory of its own (the current directory is where terms load from)."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "toyterms.py").write_text(TERMS)
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def tiny(grpo_config: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    return functools.partial(grpo_config, **TINY)


def test_the_term_is_in_the_loss_with_its_coefficient(
    tmp_path: Path, terms: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    plain = GRPOTrainer(tiny(tmp_path / "plain"))
    mine = GRPOTrainer(tiny(tmp_path / "mine", loss_term="toyterms:negative_mean_logp", loss_term_coef=0.5))
    for p, q in zip(plain.model.parameters(), mine.model.parameters(), strict=True):
        assert torch.equal(p, q)  # the same seed: the same tiny model
    plain.step = mine.step = 1
    batch = plain.rollout()
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(batch.rewards, 2)
    base, base_metrics = plain.loss(batch, adv, batch.logp_old, None, None)
    total, metrics = mine.loss(batch, adv, batch.logp_old, None, None)
    mask = batch.loss_mask
    # The weights still sampled the batch: the term is minus the sampler's mean log-likelihood.
    expected = float(-(batch.logp_old * mask).sum() / mask.sum())
    assert metrics["loss_term"] == pytest.approx(0.5 * expected, abs=1e-4) and expected > 0
    assert total.item() == pytest.approx(base.item() + metrics["loss_term"], abs=1e-6)
    assert metrics["loss"] == pytest.approx(base_metrics["loss"] + metrics["loss_term"], abs=1e-6)
    assert metrics["loss_term/tokens"] == float(mask.sum()) and metrics["loss_term/step"] == 1.0
    assert "loss_term" not in base_metrics
    # The term's gradient flows: the loss with it moves the weights otherwise than without.
    base.backward()
    total.backward()
    grads = [
        (p.grad, q.grad)
        for p, q in zip(plain.model.parameters(), mine.model.parameters(), strict=True)
        if p.grad is not None
    ]
    assert any(not torch.allclose(a, b) for a, b in grads)


def test_micro_batches_add_up_and_the_metrics_are_logged(
    tmp_path: Path, terms: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    """A constant term of 1: each micro-batch adds coef × its token share, so every update's loss_term is
    the coefficient whatever the micro-batch size; the run's metrics log it every step."""
    config = tiny(tmp_path, loss_term="toyterms:one", loss_term_coef=0.25, micro_batch_size=1, steps=2)
    trainer = GRPOTrainer(config)
    trainer.train()
    assert [m["loss_term"] for m in trainer.update_metrics] == pytest.approx([0.25])
    history = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["train/loss_term"] for r in history] == pytest.approx([0.25, 0.25])


def test_a_target_that_cannot_be_used_is_a_config_error(terms: Path) -> None:
    with pytest.raises(ConfigError, match="module:function"):
        GRPOConfig(loss_term="toyterms.one")
    with pytest.raises(ConfigError, match="cannot import the loss term's module 'no_such_module_xyz'"):
        load_loss_term("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="has no attribute 'missing'"):
        load_loss_term("toyterms:missing")
    with pytest.raises(ConfigError, match="is a int, not a function"):
        load_loss_term("toyterms:NOT_A_FUNCTION")
    assert callable(load_loss_term("toyterms:one"))


def test_a_term_returning_the_wrong_thing_is_a_config_error(
    tmp_path: Path, terms: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, loss_term="toyterms:vector"))
    trainer.step = 1
    batch = trainer.rollout()
    adv = group_advantages(batch.rewards, 2)
    with pytest.raises(
        ConfigError, match=r"toyterms:vector must return a scalar tensor as its value, got \(4,\)"
    ):
        trainer.loss(batch, adv, batch.logp_old, None, None)


def test_train_grpo_with_a_missing_term_is_one_line(
    tmp_path: Path, terms: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", "grpo", "--run-dir", str(run), "--loss-term", "no_such_module_xyz:f", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot import the loss term's module" in err
    assert not (run / "metrics.jsonl").exists()
