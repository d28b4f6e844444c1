"""``searchgym bench step``: its arithmetic on made-up timings, and a tiny run end to end.

No figure is asserted against a time: timings belong to the benchmark's output, not to tests.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.app.bench.step import (  # noqa: E402
    PHASES,
    ModelShape,
    compare_phases,
    matmul_peak,
    run_step_benchmark,
    seconds_per_step,
    split_phases,
    update_flops,
)
from searchgym.app.cli import build_parser, main  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402

TINY = [
    "--tiny-layers", "1", "--tiny-hidden", "32", "--max-turns", "2", "--max-turn-tokens", "8",
    "--questions-per-step", "2", "--group-size", "2", "--minibatch-size", "2", "--probe-size", "2",
    "--onpolicy-probe-size", "2", "--onpolicy-probe-episodes", "4", "--eval-questions", "2", "--eval-batch", "2",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- arithmetic -------------------------------------------------------------------------------------------


def test_split_phases_takes_the_rest_of_the_rollout_and_of_the_update() -> None:
    metrics = {
        "time/rollout_s": 10.0,
        "time/update_s": 8.0,
        "time/pi_old_s": 0.5,
        "time/forward_s": 3.0,
        "time/backward_s": 2.5,
        "time/optimizer_s": 0.25,
        "time/displacement_s": 1.5,
        "time/probe_s": 4.0,
        "time/ledger_s": 0.0,
        "time/eval_s": 20.0,
        "train/clip_frac": 0.5,
    }
    phases = split_phases(metrics, generation_s=7.0, retrieval_s=1.0)
    assert set(phases) == set(PHASES)
    assert phases["env"] == 2.0  # 10 - 7 - 1
    assert phases["update_other"] == pytest.approx(0.25)  # 8 - (0.5 + 3 + 2.5 + 0.25 + 1.5)
    assert phases["reference"] == phases["ledger_llds"] == phases["greedy"] == 0.0
    assert (phases["probes"], phases["evaluation"]) == (4.0, 20.0)


def test_a_step_of_the_regime_charges_probes_and_evaluation_by_their_schedule() -> None:
    phases = {"generation": 6.0, "forward": 3.0, "probes": 5.0, "evaluation": 100.0}
    assert seconds_per_step(phases, probe_every=5, eval_every=50, steps=100) == 6 + 3 + 1 + 2
    assert (
        seconds_per_step(phases, probe_every=1, eval_every=0, steps=100) == 6 + 3 + 5 + 1
    )  # one evaluation a run


def test_compare_pairs_the_repetitions_and_takes_medians() -> None:
    base = [{"forward": 2.0, "ledger": 0.0}, {"forward": 4.0, "ledger": 0.0}, {"forward": 3.0, "ledger": 0.0}]
    other = [
        {"forward": 1.0, "ledger": 0.0},
        {"forward": 3.0, "ledger": 0.0},
        {"forward": 2.4, "ledger": 0.0},
    ]
    out = compare_phases(base, other)
    assert out["forward"]["base"] == 3.0 and out["forward"]["other"] == 2.4
    # Paired ratios 0.5, 0.75, 0.8: their median, not the ratio of the medians (0.8).
    assert out["forward"]["ratio"] == 0.75
    assert math.isnan(out["ledger"]["ratio"])  # a phase the base never ran has no ratio
    with pytest.raises(ValueError, match="paired"):
        compare_phases(base, other[:2])


def test_update_flops_from_the_shapes_by_hand() -> None:
    shape = ModelShape(layers=2, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)
    assert shape.layer_weights == 4 * 2 * (2 * 2 + 2 * 1) + 3 * 4 * 8  # 48 + 96
    # One response of 3 tokens, 2 of them scored. Forward: per block 2 * 144 * 3 weights' FLOPs and
    # 4 * 2 * 2 * (1 + 2 + 3) attention FLOPs; the output layer 2 * 4 * 10 per scored token.
    forward = 2 * (2 * 144 * 3 + 16 * 6) + 2 * 4 * 10 * 2
    assert update_flops(shape, [3], scored=2) == 3 * forward
    assert update_flops(shape, [3], scored=2, passes=2) == 6 * forward


def test_model_shape_reads_a_transformers_config() -> None:
    config = SimpleNamespace(
        num_hidden_layers=3,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=8192,
    )
    assert ModelShape.of(config) == ModelShape(3, 128, 4, 2, 32, 256, 8192)


def test_matmul_peak_is_a_rate() -> None:
    assert matmul_peak("float32", size=64, seconds=0.01) > 0


# -- the command ------------------------------------------------------------------------------------------


def test_compare_options_are_parsed_over_the_command_line() -> None:
    from searchgym.app.cli.bench_step import compare_config

    args = build_parser().parse_args(["bench", "step", *TINY, "--lr", "3e-4"])
    other = compare_config(args, "--precision bf16-autocast --group-size 4 --minibatch-size 4")
    assert other.model.precision == "bf16-autocast" and other.batch.group_size == 4
    assert other.optim.lr == 3e-4 and other.batch.questions_per_step == 2  # the rest is the base's
    with pytest.raises(ConfigError, match=r"^--compare: unrecognized arguments: --bogus$"):
        compare_config(args, "--bogus")
    with pytest.raises(ConfigError, match="--compare: argument --precision: invalid choice"):
        compare_config(args, "--precision fp8")


def test_defaults_are_the_learning_studys_regime() -> None:
    args = build_parser().parse_args(["bench", "step"])
    assert (args.questions_per_step, args.group_size, args.minibatch_size) == (48, 5, 120)
    assert (args.probe_every, args.eval_questions, args.eval_every, args.threads) == (5, 500, 50, 1)
    assert args.llds == "none" and args.ledger_size == 0 and args.lr == 1e-4


def test_a_tiny_comparison_runs_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "step", *TINY, "--repeats", "2", "--compare", "--lr 3e-4"]) == 0
    out = capsys.readouterr().out
    rows = {line[:22].strip(): line for line in out.splitlines()}
    for row in ("rollout", "generation", "update", "forward", "backward", "optimizer", "step of the regime"):
        values = rows[row][22:].split()
        assert len(values) == 3 and all(math.isfinite(float(v)) for v in values), rows[row]
    assert "steps per hour" in rows and "GFLOP/s" in out
    assert "|log pi(base) - log pi(compare)|" in out


def test_the_figures_of_a_run(tmp_path: Any) -> None:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.cli._options import config_from_args

    args = build_parser().parse_args(["bench", "step", *TINY, "--run-dir", str(tmp_path)])
    config = config_from_args(GRPOConfig, args)
    other = config_from_args(GRPOConfig, argparse.Namespace(**{**vars(args), "lr": 0.0}))
    figures = run_step_benchmark(config, other, repeats=1, warmup=False, flops=False)
    for label in ("base", "other"):
        phases = figures[label]["phases"]
        assert phases["rollout"] == pytest.approx(sum(phases[p] for p in ("generation", "retrieval", "env")))
        assert phases["step"] > 0 and figures[label]["steps_per_hour"] == pytest.approx(3600 / phases["step"])
        assert phases["evaluation"] > 0 and phases["probes"] > 0  # run in every timed step
    # Same weights, same scoring options: the same log-probabilities.
    assert figures["logp_gap"]["logp_gap_max"] == 0.0
    assert figures["other"]["phases"]["optimizer"] >= 0 and figures["compare"]["step"]["ratio"] > 0
    assert not any(tmp_path.iterdir())  # the trainers ran in a temporary folder


def test_an_unshared_base_extends_every_context_and_plays_the_same_step(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.llm.session import Prefill
    from searchgym.app.cli._options import config_from_args

    seen: dict[bool, int] = {True: 0, False: 0}
    extend = Prefill.extend

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen[self.share_extensions] += 1
        return extend(self, *args, **kwargs)

    monkeypatch.setattr(Prefill, "extend", spy)
    args = build_parser().parse_args(
        ["bench", "step", *TINY, "--run-dir", str(tmp_path), "--base-rollout", "unshared"]
    )
    assert args.base_rollout == "unshared"
    config = config_from_args(GRPOConfig, args)
    figures = run_step_benchmark(config, config, repeats=1, warmup=False, flops=False, unshared_base=True)
    assert seen[False] > 0 and seen[True] > 0  # the base extended unshared, the other shared
    # The same transcripts either way: the same rewards and log-probabilities.
    assert figures["logp_gap"]["logp_gap_max"] == 0.0
    assert figures["base"]["metrics"]["rollout/reward"] == figures["other"]["metrics"]["rollout/reward"]
