"""What each supervised epoch learns from and in what batches: the random and length-sorted orders, and a
curriculum's first epochs on one question kind."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents.demonstrations import Demonstration, generate_demonstrations, write_demonstrations
from searchgym.agents.sft import LENGTH_POOL_BATCHES, epoch_batches, epoch_pools, train_sft
from searchgym.agents.training.config import SFTConfig, parse_curriculum
from searchgym.errors import ConfigError


def demo(kind: str, length: int = 3) -> Demonstration:
    return Demonstration("q", [1] * length, [2] * length, 1.0, kind=kind)


def test_a_random_epoch_is_one_shuffle_cut_into_batches() -> None:
    pool, lengths = torch.arange(10), torch.ones(10, dtype=torch.long)
    batches = epoch_batches(pool, lengths, 4, "random", torch.Generator().manual_seed(3))
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    assert [b.tolist() for b in batches] == [
        expected[:4].tolist(),
        expected[4:8].tolist(),
        expected[8:].tolist(),
    ]


def test_a_length_ordered_epoch_sees_each_demonstration_once_with_less_padding() -> None:
    n, size = 3 * LENGTH_POOL_BATCHES * 4, 4
    lengths = torch.randint(20, 400, (n,), generator=torch.Generator().manual_seed(0))
    pool = torch.arange(n)

    def padded_slots(order: str) -> int:
        batches = epoch_batches(pool, lengths, size, order, torch.Generator().manual_seed(1))
        assert sorted(torch.cat(batches).tolist()) == list(range(n))  # every demonstration, once
        assert all(len(b) == size for b in batches)
        return sum(int(lengths[b].max()) * len(b) for b in batches)

    assert padded_slots("length") < 0.75 * padded_slots("random")
    # the batches come in random order, not from the shortest up
    batches = epoch_batches(pool, lengths, size, "length", torch.Generator().manual_seed(1))
    maxima = [int(lengths[b].max()) for b in batches]
    assert maxima != sorted(maxima)


def test_a_curriculum_restricts_its_first_epochs_to_one_kind() -> None:
    demos = [demo("attribute"), demo("bridge"), demo("attribute"), demo("comparison")]
    pools = epoch_pools(demos, 3, "attribute:2")
    assert [p.tolist() for p in pools] == [[0, 2], [0, 2], [0, 1, 2, 3]]
    assert [p.tolist() for p in epoch_pools(demos, 2, None)] == [[0, 1, 2, 3]] * 2
    with pytest.raises(
        ConfigError,
        match=r"no demonstration is of a 'atribute' question; their kinds are "
        r"attribute, bridge, comparison",
    ):
        epoch_pools(demos, 3, "atribute:1")
    with pytest.raises(ConfigError, match="these demonstrations record no kind"):
        epoch_pools([demo(""), demo("")], 3, "attribute:1")


@pytest.mark.parametrize("text", ["attribute", "attribute:0", ":2", "attribute:two", "attribute:-1"])
def test_a_curriculum_that_is_not_kind_colon_epochs_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"curriculum must be KIND:N with N >= 1"):
        SFTConfig(curriculum=text)


def test_a_curriculum_longer_than_the_run_is_refused() -> None:
    assert parse_curriculum("attribute:2") == ("attribute", 2)
    with pytest.raises(
        ConfigError, match=r"asks for 5 epochs of 'attribute' demonstrations, but the run has 4"
    ):
        SFTConfig(epochs=4, curriculum="attribute:5")
    with pytest.raises(ConfigError, match="batch_order"):
        SFTConfig(batch_order="sorted")  # type: ignore[arg-type]


def test_a_curriculum_run_takes_the_updates_its_epochs_hold(tmp_path: Path) -> None:
    env = gym.make("SearchQA-v0", split="train", topk=1)
    path = tmp_path / "demos.jsonl"
    write_demonstrations(generate_demonstrations(env, 12), path)
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    attribute = kinds.count("attribute")
    assert 0 < attribute < len(kinds)
    config = SFTConfig(
        run_dir=str(tmp_path / "run"),
        demos=str(path),
        keep_unrewarded=True,
        epochs=3,
        batch_size=4,
        curriculum="attribute:2",
        batch_order="length",
        tiny_layers=1,
        tiny_hidden=32,
        eval_questions=0,
        progress=False,
        tensorboard=False,
        threads=1,
        topk=1,
    )
    train_sft(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "sft/loss" in r]
    expected = 2 * -(-attribute // 4) + -(-len(kinds) // 4)
    assert len(updates) == expected
    assert [r["sft/epoch"] for r in updates].count(2.0) == -(-len(kinds) // 4)
    # without the curriculum every epoch holds every demonstration
    train_sft(
        replace(
            config,
            run=replace(config.run, run_dir=str(tmp_path / "all")),
            sft=replace(config.sft, curriculum=None),
        )
    )
    rows = [json.loads(line) for line in (tmp_path / "all" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "sft/loss" in r]) == 3 * -(-len(kinds) // 4)
