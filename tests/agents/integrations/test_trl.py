"""The TRL integration on the CPU: rollouts, LLDS in TRL's loss, the early warning, ``train trl``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl", reason="the trl extra is part of `all`: `make test` installs it")

from searchgym.agents.grpo.losses import llds_loss  # noqa: E402
from searchgym.agents.integrations.config import TRLConfig  # noqa: E402
from searchgym.agents.integrations.trl import (  # noqa: E402
    LLDSGRPOTrainer,
    LLDSInactiveWarning,
    LLDSOptions,
    LLDWarningCallback,
    SearchQARollout,
    episode_reward,
    question_dataset,
    trl_args,
)
from searchgym.agents.llm import tiny_causal_lm, token_logprobs  # noqa: E402
from searchgym.envs.episode import Source  # noqa: E402
from searchgym.tokenization import load_tokenizer  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ENV = {"max_turn_tokens": 16, "max_context_tokens": 320, "topk": 2, "max_turns": 3}


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(None)


def _model(tok: Any, seed: int = 0) -> Any:
    return tiny_causal_lm(
        tok.vocab_size,
        layers=1,
        hidden=32,
        seed=seed,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def _trainer(tok: Any, tmp_path: Path, *, minibatch: int = 2, iterations: int = 2, **llds: Any) -> Any:
    config = TRLConfig(
        run_dir=str(tmp_path / "trl"),
        questions_per_step=2,
        group_size=2,
        minibatch_size=minibatch,
        num_iterations=iterations,
        kl_coef=0.0,
        steps=2,
        progress=False,
        **ENV,
    )
    rollout = SearchQARollout({**config.env_kwargs(), "tokenizer": tok}, seed=0)
    trainer = LLDSGRPOTrainer(
        model=_model(tok),
        reward_funcs=[episode_reward],
        args=trl_args(config),
        train_dataset=question_dataset(rollout.env(4)),
        processing_class=tok.to_transformers(),
        rollout_func=rollout,
        llds=LLDSOptions(**llds),
        tokenizer=tok,
    )
    # Set by transformers' training loop; these tests call compute_loss directly.
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    return trainer


def _oracle_inputs(tok: Any, trainer: Any) -> tuple[dict[str, Any], Any]:
    """TRL's loss inputs for two oracle episodes of one question (policy turns, tool output, answer)."""
    import gymnasium as gym

    from searchgym.agents.demonstrations import generate_demonstrations
    from searchgym.agents.integrations.trajectories import split_transcript

    env = gym.make("SearchQA-v0", tokenizer=tok, **ENV)
    demo = next(generate_demonstrations(env, 1))
    env.close()
    prompt, response, mask, _ = split_transcript(demo.tokens, demo.sources)
    assert 0 in mask and 1 in mask  # tool output between policy turns
    n, c = len(prompt), len(response)
    ids = torch.tensor([response, response])
    inputs = {
        "prompt_ids": torch.tensor([prompt, prompt]),
        "prompt_mask": torch.ones(2, n, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": torch.ones(2, c, dtype=torch.long),
        "tool_mask": torch.tensor([mask, mask]),
        "advantages": torch.tensor([0.7, -0.7]),
        "num_items_in_batch": torch.tensor(2 * sum(mask)),
    }
    # pi_old: the current policy's log-probs, shifted so that some tokens lost likelihood (d > 0).
    full = torch.cat([inputs["prompt_ids"], ids], dim=1)
    with torch.no_grad():
        logp, _ = token_logprobs(trainer.model, full, torch.ones_like(full), vocab_size=tok.vocab_size)
    shift = torch.linspace(-0.3, 0.5, c).expand(2, c)
    inputs["old_per_token_logps"] = logp[:, n:] + shift
    return inputs, demo


def test_rollout_func_returns_the_env_transcripts(tok: Any) -> None:
    rollout = SearchQARollout({"tokenizer": tok, **ENV}, seed=3)
    trainer = SimpleNamespace(
        model=_model(tok),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m, process_index=0),
        temperature=1.0,
    )
    ids = [q.id for q in rollout.env(1).questions[:2]]
    prompts = [ids[0], ids[0], ids[1], ids[1]]  # as TRL's sampler repeats them
    out = rollout(prompts, trainer)
    batch = rollout.last_batch
    assert batch is not None and len(out["completion_ids"]) == len(prompts)
    for i in range(len(prompts)):
        n = int(batch.attention_mask[i].sum())
        tokens, sources = batch.tokens[i, :n].tolist(), batch.sources[i, :n].tolist()
        assert out["prompt_ids"][i] + out["completion_ids"][i] == tokens  # token-exact, nothing re-encoded
        p = len(out["prompt_ids"][i])
        assert all(s == Source.PROMPT for s in sources[:p])
        assert out["env_mask"][i] == [int(s == Source.POLICY) for s in sources[p:]]
        assert len(out["logprobs"][i]) == len(out["completion_ids"][i])
        assert batch.infos[i]["question_id"] == prompts[i]
        assert out["searchgym_reward"][i] == float(batch.rewards[i])
    assert episode_reward(["x"] * 4, out["searchgym_reward"]) == out["searchgym_reward"]


def test_vllm_path_is_cut_by_the_env(tok: Any) -> None:
    """With use_vllm, turns come from trainer.vllm_generation; the env keeps tokens up to the turn's end."""
    answer = tok.encode("<answer> x </answer>")
    extra = tok.encode(" trailing")

    class FakeVLLM:
        def generate(self, prompts: list[list[int]], images: Any, num_generations: int) -> tuple:
            assert images is None and num_generations == 1
            ids = [answer + extra for _ in prompts]
            return prompts, ids, [[[-0.5]] * len(i) for i in ids], None

    rollout = SearchQARollout({"tokenizer": tok, **ENV})
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=FakeVLLM())
    qid = rollout.env(1).questions[0].id
    out = rollout([qid, qid], trainer)
    assert out["completion_ids"] == [answer, answer]  # the text after </answer> was not kept
    assert out["env_mask"] == [[1] * len(answer)] * 2
    assert out["logprobs"][0] == [-0.5] * len(answer)


@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_llds_in_trl_loss_equals_searchgym_llds(tok: Any, tmp_path: Path, gate: str) -> None:
    trainer = _trainer(tok, tmp_path, gate=gate, coef=0.2)
    trainer.model.train()
    inputs, _ = _oracle_inputs(tok, trainer)
    loss = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss)
    # The same batch through searchgym's own scoring and llds_loss.
    full = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    logp, _ = token_logprobs(trainer.model, full, torch.ones_like(full), vocab_size=tok.vocab_size)
    n = inputs["prompt_ids"].shape[1]
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    expected, metrics = llds_loss(
        logp[:, n:], inputs["old_per_token_logps"], inputs["advantages"], mask, gate
    )
    assert float(expected) > 0
    assert trainer.llds_last["llds_loss"] == pytest.approx(float(expected), rel=1e-5, abs=1e-7)
    assert trainer.llds_last["llds_gate_open"] == pytest.approx(metrics["llds_gate_open"])


def test_env_token_gradients_are_exactly_zero(tok: Any, tmp_path: Path) -> None:
    trainer = _trainer(tok, tmp_path, gate="action", coef=0.2)
    trainer.model.train()
    inputs, _ = _oracle_inputs(tok, trainer)
    loss = trainer._compute_loss(trainer.model, inputs)
    logp = trainer.llds_logp
    logp.retain_grad()
    loss.backward()
    tool = inputs["tool_mask"] == 0
    assert bool(tool.any())
    assert torch.equal(logp.grad[tool], torch.zeros_like(logp.grad[tool]))  # exactly zero, not approximately
    assert float(logp.grad[~tool].abs().sum()) > 0


def test_llds_ma_weights_the_answer_span(tok: Any, tmp_path: Path) -> None:
    trainer = _trainer(tok, tmp_path, gate="token", coef=0.2, ma=True, ma_beta=0.0)
    trainer.model.train()
    inputs, _ = _oracle_inputs(tok, trainer)
    from searchgym.agents.grpo.losses import answer_span_mask, answer_weights

    sources = torch.where(inputs["tool_mask"].bool(), int(Source.POLICY), int(Source.TOOL))
    weights = answer_weights(answer_span_mask(inputs["completion_ids"], sources, tok.token_bytes), 0.0)
    assert float((weights == 0).sum()) > 0
    trainer._compute_loss(trainer.model, {**inputs, "llds_weights": weights})
    full = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    logp, _ = token_logprobs(trainer.model, full, torch.ones_like(full), vocab_size=tok.vocab_size)
    n = inputs["prompt_ids"].shape[1]
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    expected, _ = llds_loss(
        logp[:, n:], inputs["old_per_token_logps"], inputs["advantages"], mask, "token", weights
    )
    assert trainer.llds_last["llds_loss"] == pytest.approx(float(expected), rel=1e-5, abs=1e-7)


def test_warns_when_llds_cannot_act(tok: Any, tmp_path: Path) -> None:
    with pytest.warns(LLDSInactiveWarning, match="identically zero"):
        trainer = _trainer(tok, tmp_path, minibatch=4, iterations=1)  # one update per rollout batch
    assert not trainer.llds_can_act
    with warnings.catch_warnings():
        warnings.simplefilter("error", LLDSInactiveWarning)
        assert _trainer(tok, tmp_path, minibatch=4, iterations=2).llds_can_act
        assert _trainer(tok, tmp_path, minibatch=2, iterations=1).llds_can_act  # two mini-batch updates


def test_lld_warning_callback_uses_the_pure_rule() -> None:
    callback = LLDWarningCallback(window=2)
    state = SimpleNamespace(global_step=0)
    fired = []
    for step, delta in enumerate([0.1, -0.2, None, 0.0, 0.3], start=1):
        state.global_step = step
        logs: dict[str, Any] = {"loss": 1.0} if delta is None else {"lld/delta_adv_pos": delta}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            callback.on_log(None, state, None, logs)
        fired.append((logs.get("lld/warning"), len(caught)))
    # Steps without the metric are not records; -0.2 then 0.0 are two consecutive records <= 0.
    assert fired == [(0.0, 0), (0.0, 0), (None, 0), (1.0, 1), (0.0, 0)]
    assert callback.fired_at == [4]


def test_train_trl_two_steps_end_to_end(tmp_path: Path) -> None:
    from searchgym.cli import main

    run = tmp_path / "run"
    argv = ["train", "trl", "--run-dir", str(run), "--steps", "3", "--questions-per-step", "2"]
    argv += ["--group-size", "2", "--tiny-layers", "1", "--tiny-hidden", "32", "--eval-questions", "2"]
    argv += ["--eval-batch", "2", "--no-progress", "--max-turn-tokens", "16", "--max-context-tokens", "320"]
    assert main(argv) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/llds_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert any(r.get("lld/delta_adv_zero") is not None for r in steps)  # rollout batch 1, re-scored
    assert "eval/em" in records[-1]
    assert (run / "model" / "config.json").is_file()


def test_missing_trl_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['trl'] = None\n"
        "from searchgym.errors import MissingDependencyError\n"
        "try:\n    import searchgym.agents.integrations.trl\n"
        "except MissingDependencyError as e:\n    print(e.extra)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "trl"
