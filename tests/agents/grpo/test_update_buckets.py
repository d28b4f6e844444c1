"""Length-bucketed micro-batches: less padding, the same update, and pi_old still exact on the first update."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.advantages import group_advantages  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer, length_buckets  # noqa: E402


def test_buckets_are_a_permutation_within_the_size_bound() -> None:
    lengths = torch.tensor([50, 10, 48, 12, 30, 11, 49, 29])
    index = torch.tensor([6, 0, 3, 1, 5, 7])
    for max_size in (1, 2, 3, 6):
        for overhead in (0.0, 5.0, 1e9):
            runs = length_buckets(index, lengths, max_size, overhead)
            assert sorted(torch.cat(runs).tolist()) == sorted(index.tolist())
            assert all(1 <= len(r) <= max_size for r in runs)
    # No overhead: one run per distinct length; a huge one: as few runs as the bound allows.
    assert [r.tolist() for r in length_buckets(index, lengths, 6, 0.0)] == [[0], [6], [7], [3], [5], [1]]
    assert len(length_buckets(index, lengths, 6, 1e9)) == 1
    assert len(length_buckets(index, lengths, 4, 1e9)) == 2


def test_buckets_minimise_padded_slots_plus_overhead() -> None:
    """Against brute force over every cut of the sorted order."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(1, 100, (7,), generator=gen)
        index = torch.arange(7)
        overhead, max_size = 40.0, 3

        size = sorted(lengths.tolist(), reverse=True)
        best = float("inf")
        for mask in range(1 << 6):  # a cut or not after each of the first 6 sorted responses
            bounds = [0] + [i + 1 for i in range(6) if mask >> i & 1] + [7]
            parts = [size[a:b] for a, b in itertools.pairwise(bounds)]
            if all(len(p) <= max_size for p in parts):
                best = min(best, sum(len(p) * p[0] + overhead for p in parts))
        runs = length_buckets(index, lengths, max_size, overhead)
        assert sum(len(r) * int(lengths[r].max()) + overhead for r in runs) == best


SIZES: dict[str, Any] = {
    "max_turns": 3,
    "max_turn_tokens": 12,
    "max_context_tokens": 768,
    "questions_per_step": 2,
    "group_size": 4,
    "minibatch_size": 4,
    "micro_batch_size": 2,
    "epochs": 2,
    "probe_size": 0,
    "onpolicy_probe_size": 0,  # the untrained model finds none: 512 sampled episodes for nothing
}


@pytest.fixture
def config(grpo_config: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    """2 questions x G 4, two epochs of micro-batches of 2 (``config(folder, **overrides)``)."""
    return functools.partial(grpo_config, **SIZES)


@pytest.mark.slow
def test_bucketed_and_plain_micro_batches_make_the_same_update(
    tmp_path: Path, config: Callable[..., GRPOConfig]
) -> None:
    trainer = GRPOTrainer(config(tmp_path, llds="action"))
    trainer.step = 1
    batch = trainer.rollout()
    lengths = batch.attention_mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 1, "responses of different lengths are what bucketing is for"
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    adv = group_advantages(batch.rewards, 4)
    start = (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.optimizer.state_dict()))
    params, first = {}, {}
    for bucketed in (False, True):
        trainer.config = dataclasses.replace(
            trainer.config, batch=dataclasses.replace(trainer.config.batch, length_buckets=bucketed)
        )
        trainer.model.load_state_dict(start[0])
        trainer.optimizer.load_state_dict(start[1])
        metrics = trainer.update(batch, adv)
        params[bucketed] = [p.detach().clone() for p in trainer.model.parameters()]
        first[bucketed] = trainer.update_metrics[0]
        # pi_old was re-scored in the first epoch's own micro-batches: the first update is exactly on-policy.
        assert trainer.update_metrics[0]["llds_loss"] == 0.0
        assert trainer.update_metrics[0]["max_abs_log_ratio"] == 0.0
        assert metrics["train/llds_loss"] > 0.0  # and LLDS acts on the later updates
    for a, b in zip(params[False], params[True], strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert first[False]["pg_loss"] == pytest.approx(first[True]["pg_loss"], rel=1e-5, abs=1e-7)
