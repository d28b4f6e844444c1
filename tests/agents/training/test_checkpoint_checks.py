"""``agents/training/checkpoint_checks.py``: what a checkpoint may describe, checked before anything is built from
it — the architecture bounded by the weights the file stores, every config field held to its declared type and
range (also when ``eval`` loads it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from searchgym.errors import CheckpointError
from searchgym.options import flat_options

from ..conftest import grpo_payload

torch = pytest.importorskip("torch")

from searchgym.agents.training.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from searchgym.agents.training.checkpoint_checks import MAX_CONTEXT_TOKENS, check_config  # noqa: E402

# -- the architecture ------------------------------------------------------------------------------------------


def test_a_small_checkpoint_describing_a_huge_tiny_model_is_refused(tmp_path: Path) -> None:
    from searchgym.agents.training.config import ModelConfig
    from searchgym.agents.training.policy import build_policy

    arch = {"kind": "tiny", "layers": 65536, "hidden": 65536, "tokenizer": None}
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch=arch))
    assert path.stat().st_size < 8 << 10
    with pytest.raises(CheckpointError, match="'layers'"):
        load_checkpoint(path)
    # Within the layer bound, the size is checked against the weights the file stores.
    arch = {"kind": "tiny", "layers": 2, "hidden": 65536, "tokenizer": None}
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch=arch))
    with pytest.raises(CheckpointError, match=r"at least 17,179,869,184 parameters.*stores 72 weights"):
        build_policy(ModelConfig(init=str(path)))


def test_a_config_architecture_is_bounded_before_it_is_built(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    }
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch={"kind": "config", "config": config}))
    with pytest.raises(CheckpointError, match=r"parameters but the checkpoint stores 72 weights"):
        load_checkpoint(path)
    for field, value in (("num_hidden_layers", 10**6), ("hidden_size", 10**12), ("hidden_size", 2**40)):
        bomb = {**config, field: value}
        path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch={"kind": "config", "config": bomb}))
        with pytest.raises(CheckpointError, match=field):
            load_checkpoint(path)


def test_a_real_tiny_checkpoint_passes_the_size_check(tmp_path: Path) -> None:
    from searchgym.agents.training.config import ModelConfig
    from searchgym.agents.training.policy import build_policy

    policy, arch = build_policy(ModelConfig(tiny_layers=2, tiny_hidden=32))
    path = save_checkpoint(
        tmp_path / "c.pt", {"kind": "sft", "step": 0, "model": policy.model.state_dict(), "arch": arch}
    )
    loaded, _ = build_policy(ModelConfig(init=str(path)))
    assert all(
        torch.equal(a, b) for a, b in zip(policy.model.parameters(), loaded.model.parameters(), strict=True)
    )


def test_a_crafted_architecture_is_refused_before_building_a_model(tmp_path: Path) -> None:
    from searchgym.agents.training.config import ModelConfig
    from searchgym.agents.training.policy import build_policy

    path = save_checkpoint(
        tmp_path / "c.pt",
        {
            "kind": "sft",
            "step": 0,
            "model": {},
            "arch": {"kind": "tiny", "layers": 10**9, "hidden": 8, "tokenizer": None},
        },
    )
    with pytest.raises(CheckpointError, match="'layers'"):
        build_policy(ModelConfig(init=str(path)))


# -- the config ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_turn_tokens", "abc", r"'max_turn_tokens' is 'abc' \(str\), expected int"),
        (
            "max_context_tokens",
            10**12,
            rf"'max_context_tokens' is 1000000000000, more than the {MAX_CONTEXT_TOKENS}",
        ),
        ("max_turn_tokens", 0, "max_turn_tokens must be >= 1"),
        ("lr", float("nan"), "'lr' is nan, not a finite number"),
        ("lr", "0.1", r"'lr' is '0.1' \(str\), expected float"),
        ("progress", 1, r"'progress' is 1 \(int\), expected bool"),
        ("seed", 10**30, "does not fit in 64 bits"),
        ("dtype", "float8", r"'dtype' is 'float8'.*Literal\['float32', 'bfloat16', 'float16', 'float64'\]"),
    ],
)
def test_a_bad_checkpoint_config_field_is_named(tmp_path: Path, field: str, value: Any, message: str) -> None:
    payload = grpo_payload()
    payload["config"] = {**payload["config"], field: value}
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


def test_fields_added_to_the_config_dataclass_are_checked_by_their_type_hint() -> None:
    from searchgym.agents.grpo.config import GRPOConfig

    # Every int option, in every section, refuses a string: no hard-coded list decides which are checked.
    int_fields = [name for name, (_, _, hint) in flat_options(GRPOConfig).items() if hint is int]
    assert len(int_fields) >= 10
    for name in int_fields:
        with pytest.raises(CheckpointError, match=repr(name)):
            check_config({name: "7"}, "grpo", "c.pt")
    check_config({"unknown_field_of_another_version": "x"}, "grpo", "c.pt")  # ignored, not an error


def test_eval_with_a_bad_checkpoint_config_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.app.cli import main

    for field, value in (("max_turn_tokens", "abc"), ("max_context_tokens", 10**12)):
        payload = grpo_payload()
        payload["config"] = {**payload["config"], field: value}
        path = save_checkpoint(tmp_path / "c.pt", payload)
        code = main(["eval", "--agent", f"checkpoint:{path}", "--episodes", "1", "--no-progress"])
        err = capsys.readouterr().err
        assert code != 0 and field in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("tokens", "sources", "message"),
    [
        ([1, 2, 10**6, 3], [1, 2, 2, 2], r"ledger.*token id 1000000 outside the vocabulary"),
        ([1, 2, -1, 3], [1, 2, 2, 2], r"ledger.*token id -1 outside the vocabulary"),
        ([1, 2, 3, 4], [1, 2, 9, 2], r"ledger.*source mark 9"),
    ],
    ids=["too-large", "negative", "source"],
)
def test_a_resealed_ledger_with_ids_out_of_range_is_refused_on_resume(
    tmp_path: Path, tokens: list[int], sources: list[int], message: str
) -> None:
    """A checkpoint's ledger carries token ids the model will embed: each is range-checked on load, so a
    crafted (re-sealed) file is a CheckpointError at --resume, not an IndexError inside a training step."""
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.ledger import LedgerEntry
    from searchgym.agents.grpo.trainer import GRPOTrainer

    def config(**values: Any) -> GRPOConfig:
        sizes = {"questions_per_step": 2, "group_size": 2, "minibatch_size": 2, "probe_size": 0}
        return GRPOConfig(
            run_dir=str(tmp_path / "run"), steps=1, eval_questions=0, progress=False, tensorboard=False,
            onpolicy_probe_size=0, ledger_size=4, **sizes, **values,
        )  # fmt: skip

    trainer = GRPOTrainer(config())
    assert trainer.ledger is not None
    n = len(tokens)
    trainer.ledger.entries.append(LedgerEntry(torch.tensor(tokens), torch.tensor(sources), torch.zeros(n), 0))
    trainer.save()  # sealed with the crafted entry, as whoever rewrites a checkpoint would
    with pytest.raises(CheckpointError, match=message):
        GRPOTrainer(config(resume=True))
