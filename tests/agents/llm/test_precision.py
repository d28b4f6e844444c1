"""``--precision bf16-autocast``: bfloat16 matrix products, float32 log-probabilities, fp32 probes, and a
machine without bfloat16 running fp32 with one line.

Autocast works on any CPU (slowly where the CPU has no native bfloat16), so these tests run everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import searchgym.agents.llm.precision as precision_module  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.agents.llm import DEFAULT_SCORING, LLMPolicy, tiny_causal_lm, token_logprobs  # noqa: E402
from searchgym.agents.llm.precision import bf16_support, cpu_flags, resolve_precision  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402

BF16 = dataclasses.replace(DEFAULT_SCORING, autocast_bf16=True)
SIZES: dict[str, Any] = {
    "tiny_layers": 1,
    "tiny_hidden": 32,
    "max_turns": 2,
    "max_turn_tokens": 8,
    "questions_per_step": 2,
    "group_size": 2,
    "minibatch_size": 2,
    "probe_size": 3,
    "onpolicy_probe_size": 0,
    "ledger_size": 0,
}


@pytest.fixture
def config(grpo_config: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    return functools.partial(grpo_config, **SIZES)


@pytest.fixture
def supported(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine counts as having native bfloat16, whatever it has (the maths is the same)."""
    monkeypatch.setattr(precision_module, "bf16_support", lambda device="cpu", flags=None: (True, "test"))


def batch(seed: int = 0) -> tuple[Any, Any, Any]:
    model = tiny_causal_lm(8192, layers=2, hidden=64, seed=seed)
    ids = torch.randint(0, 8192, (3, 40), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    return model, ids, mask


# -- detection ------------------------------------------------------------------------------------------


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n\nprocessor\t: 1\nflags\t: fpu\n"
    )
    assert cpu_flags(info) == {"fpu", "avx512f", "avx512_bf16", "amx_tile"}
    assert cpu_flags(tmp_path / "missing") == set()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx512f", "avx512_bf16"}, (True, "CPU flags avx512_bf16")),
        ({"amx_bf16", "avx512_bf16"}, (True, "CPU flags amx_bf16, avx512_bf16")),
        ({"avx2", "avx512f"}, (False, "the CPU has neither amx_bf16 nor avx512_bf16")),
    ],
)
def test_bf16_support_names_the_flags(flags: set[str], expected: tuple[bool, str]) -> None:
    assert bf16_support("cpu", flags) == expected


def test_without_bf16_a_run_is_fp32_and_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        precision_module, "bf16_support", lambda device="cpu", flags=None: (False, "no flags")
    )
    assert resolve_precision("bf16-autocast") == "fp32"
    assert capsys.readouterr().err == "searchgym: --precision bf16-autocast: no flags; running fp32\n"
    assert resolve_precision("fp32") == "fp32" and capsys.readouterr().err == ""


def test_an_unknown_precision_lists_the_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown precision 'fp16'; choose one of \['fp32', 'bf16-autocast'\]"
    ):
        GRPOConfig(precision="fp16")  # type: ignore[arg-type]


# -- scoring and sampling ---------------------------------------------------------------------------------


def test_bf16_scoring_gives_float32_logprobs_near_fp32_and_gradients_to_float32_weights() -> None:
    model, ids, mask = batch()
    exact, _ = token_logprobs(model, ids, mask, score_mask=mask.bool())
    logp, entropy = token_logprobs(model, ids, mask, with_entropy=True, score_mask=mask.bool(), scoring=BF16)
    assert logp.dtype == entropy.dtype == torch.float32
    gap = (logp - exact).abs().max()
    assert 0 < gap < 0.05  # bfloat16 products (not fp32), within their rounding
    (logp.sum() + entropy.sum()).backward()
    assert all(p.dtype == torch.float32 and p.grad is not None for p in model.parameters())
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)


def test_bf16_scoring_of_every_position_matches_the_selected_path() -> None:
    model, ids, mask = batch()
    whole, _ = token_logprobs(model, ids, mask, scoring=BF16)
    selected, _ = token_logprobs(model, ids, mask, score_mask=mask.bool(), scoring=BF16)
    assert whole.dtype == torch.float32 and (whole - selected).abs().max() < 0.05


def test_bf16_generation_draws_with_float32_logprobs_near_a_full_forward() -> None:
    model, ids, _ = batch()
    policy = LLMPolicy(model, temperature=1.0, max_turn_tokens=6, scoring=BF16, seed=0)
    segments = policy.generate_segments([ids[0, :20].tolist(), ids[2, :12].tolist()])
    assert all(s.logprobs.dtype == torch.float32 and len(s.tokens) > 0 for s in segments)
    row = ids[0, :20].tolist() + segments[0].tokens
    full, _ = policy.token_logprobs(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))
    assert (full[0, 20:] - segments[0].logprobs).abs().max() < 0.05


# -- the trainer -----------------------------------------------------------------------------------------


def test_the_trainer_takes_its_precision_and_scores_probes_in_fp32(
    tmp_path: Path, config: Callable[..., GRPOConfig], supported: None
) -> None:
    fp32 = GRPOTrainer(config(tmp_path / "fp32"))
    bf16 = GRPOTrainer(config(tmp_path / "bf16", precision="bf16-autocast"))
    assert not fp32.policy.scoring.autocast_bf16 and bf16.policy.scoring.autocast_bf16
    # Same seed, same weights: the probes read the same, bit for bit, at either precision.
    a, b = bf16.probe_metrics(), fp32.probe_metrics()
    assert a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)
    assert bf16._score_all(bf16.probe).ne(fp32._score_all(fp32.probe)).any()  # the step's own scoring is bf16


def test_a_bf16_step_that_changes_nothing_measures_no_displacement(
    tmp_path: Path, config: Callable[..., GRPOConfig], supported: None
) -> None:
    """The frozen control at bf16: pi_old and the re-score after the updates are the same bf16 function."""
    trainer = GRPOTrainer(config(tmp_path, precision="bf16-autocast", lr=0.0, rescore_pi_old=True))
    metrics = trainer.train()
    assert metrics["train/clip_frac"] == 0.0
    for sign in ("pos", "zero", "neg"):
        value = metrics[f"lld/delta_adv_{sign}"]
        assert value != value or value == 0.0  # NaN where no response has that sign


def test_the_step_logs_the_time_of_its_phases(tmp_path: Path, config: Callable[..., GRPOConfig]) -> None:
    metrics = GRPOTrainer(config(tmp_path, eval_questions=2, eval_batch=2)).train()
    for phase in ("rollout", "update", "pi_old", "forward", "backward", "optimizer", "displacement", "eval"):
        assert metrics[f"time/{phase}_s"] >= 0, phase
    parts = sum(
        metrics[f"time/{p}_s"] for p in ("pi_old", "forward", "backward", "optimizer", "displacement")
    )
    assert parts <= metrics["time/update_s"]
