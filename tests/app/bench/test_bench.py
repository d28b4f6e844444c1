"""The speed benchmarks run end to end on tiny settings and report every figure the docs quote.

No figure is asserted against a time: timings belong to the benchmark's output, not to tests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.app.bench.env import env_us_per_step  # noqa: E402
from searchgym.app.bench.evaluation import run_eval_benchmark  # noqa: E402
from searchgym.app.bench.training import run_rollout_benchmark, run_update_benchmark  # noqa: E402
from searchgym.app.cli import build_parser, main  # noqa: E402

SMALL: dict[str, Any] = {"max_turns": 2, "max_turn_tokens": 8, "max_context_tokens": 768, "probe_size": 4}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def positive(figures: dict[str, Any], *keys: str) -> None:
    for key in keys:
        assert math.isfinite(figures[key]) and figures[key] > 0, key


def test_rollout_benchmark_compares_with_generate_in_the_same_run() -> None:
    figures = run_rollout_benchmark(repeats=1, questions=2, group_size=2, overrides=SMALL)
    positive(figures, "rollout_tokens_per_s", "rollout_tokens_per_s_before", "generate_tokens_per_s")
    assert (
        figures["rollout_vs_generate"] == figures["rollout_tokens_per_s"] / figures["generate_tokens_per_s"]
    )
    assert figures["rollout_logp_mismatch"] < 1e-3  # the cached path scores the same tokens alike


def test_update_benchmark_reports_the_speedup_and_the_step_split() -> None:
    figures = run_update_benchmark(repeats=1, questions=2, group_size=2, overrides=SMALL)
    positive(
        figures,
        "update_tokens_per_s",
        "update_tokens_per_s_before",
        "update_tokens_per_s_rescored",
        "step_rollout_s",
        "step_update_s",
    )
    # One run: the median of the per-run ratios is that run's ratio.
    assert figures["update_speedup"] == pytest.approx(
        figures["update_tokens_per_s"] / figures["update_tokens_per_s_before"]
    )
    assert figures["update_speedup_with_diagnostics"] == pytest.approx(
        figures["update_tokens_per_s_with_diagnostics"]
        / figures["update_tokens_per_s_before_with_diagnostics"]
    )
    # Diagnostics time is excluded from the update's own rate, so counting it can only lower the rate.
    assert 0 < figures["update_tokens_per_s_with_diagnostics"] < figures["update_tokens_per_s"]
    assert 0 <= figures["update_logp_mismatch"] < 1e-3  # the sampler's log-probs stand in for pi_old
    assert 0 <= figures["padding_share"] <= figures["padding_share_before"] < 1
    shares = sum(figures[f"step_{k}_share"] for k in ("rollout", "update", "diagnostics"))
    assert shares == pytest.approx(1.0)


def test_the_update_benchmarks_paths_run_the_options_they_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timed path reaches the trainer with its own options (a new config each, never a changed one):
    "before" without length buckets, the others with them, and "before" and "after" never the same."""
    from searchgym.agents.grpo.trainer import GRPOTrainer

    seen: list[tuple[bool, bool | None]] = []
    scorings: dict[tuple[bool, bool | None], set[Any]] = {}
    update = GRPOTrainer.update

    def recording(self: GRPOTrainer, *args: Any) -> Any:
        options = (self.config.batch.length_buckets, self.config.loss.rescore_pi_old)
        seen.append(options)
        scorings.setdefault(options, set()).add(self.policy.scoring)
        return update(self, *args)

    monkeypatch.setattr(GRPOTrainer, "update", recording)
    run_update_benchmark(repeats=1, questions=2, group_size=2, overrides=SMALL)
    options = set(seen)
    assert (False, True) in options, "the 'before' path: no length buckets, every response re-scored"
    assert any(buckets for buckets, _ in options), "today's paths bucket by length"
    assert len(options) == 3, f"three paths, three sets of options: {options}"
    # Before and after also score differently (plain autograd against today's fused, shared-prefix path).
    before = scorings[(False, True)]
    after = set().union(*(s for o, s in scorings.items() if o != (False, True)))
    assert len(before) == 1 and before.isdisjoint(after), (before, after)


def test_eval_and_env_benchmarks(tmp_path: Path) -> None:
    figures = run_eval_benchmark(episodes=4, repeats=1, data_dir=tmp_path)  # no HotpotQA there
    positive(figures, "eval_episodes_per_s_world", "eval_episodes_per_s_world_repeat")
    assert "eval_episodes_per_s_hotpotqa" not in figures
    us = env_us_per_step(sizes=(1, 8), steps=60, repeats=1)
    assert set(us) == {"1", "8"} and all(v > 0 for v in us.values())


def test_eval_benchmark_compares_hotpotqa_per_episode_and_per_step(hotpot_dir: Path) -> None:
    figures = run_eval_benchmark(episodes=6, repeats=1, data_dir=hotpot_dir.parent)
    positive(figures, "eval_episodes_per_s_hotpotqa", "eval_steps_per_s_hotpotqa", "eval_steps_per_s_world")
    for name in ("world", "hotpotqa"):  # every episode takes several steps
        assert figures[f"eval_steps_per_s_{name}"] > 5 * figures[f"eval_episodes_per_s_{name}"]
    # One run: each ratio is that run's ratio of the two rates.
    assert figures["hotpotqa_vs_world"] == pytest.approx(
        figures["eval_episodes_per_s_hotpotqa"] / figures["eval_episodes_per_s_world"]
    )
    assert figures["hotpotqa_vs_world_per_step"] == pytest.approx(
        figures["eval_steps_per_s_hotpotqa"] / figures["eval_steps_per_s_world"]
    )


def test_bench_commands_are_registered() -> None:
    parser = build_parser()
    args = parser.parse_args(["bench", "all", "--quick", "--json"])
    assert args.quick and args.json
    for part in ("rollout", "update", "env", "eval", "retrieval"):
        assert callable(parser.parse_args(["bench", part])._run)


def test_bench_eval_prints_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert (
        main(["bench", "eval", "--episodes", "3", "--repeats", "1", "--data", str(tmp_path), "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["eval_episodes_per_s_world"] > 0


def test_a_paths_config_is_a_new_one_and_the_base_is_unchanged() -> None:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.bench.training import path_config

    base = GRPOConfig(**SMALL)
    before = path_config(base, {"length_buckets": False, "rescore_pi_old": True})
    after = path_config(base, {"length_buckets": True, "rescore_pi_old": None})
    assert (before.batch.length_buckets, before.loss.rescore_pi_old) == (False, True)
    assert (after.batch.length_buckets, after.loss.rescore_pi_old) == (True, None)
    assert before != after and before.env == after.env == base.env
    assert base == GRPOConfig(**SMALL)  # the base config is never changed
