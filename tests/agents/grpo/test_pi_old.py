"""Where pi_old comes from (``rescore_pi_old``): the default takes the first update's own forward and the
sampler's log-probs, and makes the same update as a separate re-scoring pass."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.advantages import group_advantages  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.pi_old import PI_OLD_TOLERANCE  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402

SIZES: dict[str, Any] = {
    "max_turns": 3,
    "max_turn_tokens": 12,
    "max_context_tokens": 768,
    "questions_per_step": 3,
    "group_size": 4,
    "minibatch_size": 4,
    "micro_batch_size": 2,
    "epochs": 2,
    "probe_size": 0,
    "onpolicy_probe_size": 0,  # the untrained model finds none: 512 sampled episodes for nothing
    "llds": "action",
}


@pytest.fixture(scope="module")
def config(grpo_config: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    """3 questions x G 4, two epochs of micro-batches of 2, LLDS on (``config(folder, **overrides)``)."""
    return functools.partial(grpo_config, **SIZES)


def run_update(
    trainer: GRPOTrainer, start: Any, batch: Any, adv: Any, rescore: bool | None
) -> dict[str, Any]:
    trainer.config = dataclasses.replace(
        trainer.config, loss=dataclasses.replace(trainer.config.loss, rescore_pi_old=rescore)
    )
    trainer.model.load_state_dict(start[0])
    trainer.optimizer.load_state_dict(start[1])
    metrics = trainer.update(batch, adv)
    return {
        "metrics": metrics,
        "updates": copy.deepcopy(trainer.update_metrics),
        "params": [p.detach().clone() for p in trainer.model.parameters()],
    }


def close_weights(a: list[Any], b: list[Any], tol: float = 1e-5) -> bool:
    """Whether two weight lists differ by less than ``tol`` relative to the weights' norm."""
    diff = torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b, strict=True)))
    norm = torch.sqrt(sum((y**2).sum() for y in b))
    return bool(diff / norm < tol)


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, config: Callable[..., GRPOConfig]
) -> tuple[GRPOTrainer, Any, Any, Any]:
    trainer = GRPOTrainer(config(tmp_path_factory.mktemp("pi_old")))
    trainer.step = 1
    batch = trainer.rollout()
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    start = (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.optimizer.state_dict()))
    return trainer, start, batch, group_advantages(batch.rewards, 4)


def test_default_makes_the_update_a_rescoring_pass_makes(setup: Any) -> None:
    trainer, start, batch, adv = setup
    assert GRPOConfig().loss.rescore_pi_old is None
    auto = run_update(trainer, start, batch, adv, None)
    rescored = run_update(trainer, start, batch, adv, True)
    # The first update is exactly on-policy either way: its own forward is pi_old.
    for run in (auto, rescored):
        assert run["updates"][0]["max_abs_log_ratio"] == 0.0
        assert run["updates"][0]["llds_loss"] == 0.0
        assert run["metrics"]["train/llds_loss"] > 0.0  # LLDS acts on the later updates
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        assert auto["updates"][0][key] == pytest.approx(rescored["updates"][0][key], rel=1e-6, abs=1e-9)
    # The later updates see the sampler's log-probs, equal to a full forward up to float noise.
    mismatch = auto["metrics"]["rollout/logp_mismatch"]
    assert 0.0 <= mismatch < 1e-4
    for a, b in zip(auto["updates"][1:], rescored["updates"][1:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    # Adam's normalised steps (lr 1e-2 here) carry that noise into a few near-zero gradient entries; the
    # weights as a whole agree.
    assert close_weights(auto["params"], rescored["params"])
    assert auto["metrics"]["lld/delta_adv_pos"] == pytest.approx(
        rescored["metrics"]["lld/delta_adv_pos"], rel=1e-3, abs=1e-5
    )


def test_sampler_log_probs_off_by_more_than_the_tolerance_are_rescored(setup: Any) -> None:
    trainer, start, batch, adv = setup
    rescored = run_update(trainer, start, batch, adv, True)
    skewed = copy.copy(batch)
    skewed.logp_old = batch.logp_old - 10 * PI_OLD_TOLERANCE * batch.loss_mask  # a bf16-sized gap
    auto = run_update(trainer, start, skewed, adv, None)
    assert auto["metrics"]["rollout/logp_mismatch"] == pytest.approx(10 * PI_OLD_TOLERANCE, rel=1e-3)
    assert close_weights(auto["params"], rescored["params"])  # the gap was re-scored away
    sampler = run_update(trainer, start, skewed, adv, False)  # taken as it is, the gap changes the update
    assert not close_weights(sampler["params"], rescored["params"])
    assert math.isnan(sampler["metrics"]["rollout/logp_mismatch"])
