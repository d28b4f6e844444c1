"""The TRL integration on the CPU: rollouts, LLDS in TRL's loss, the early warning, ``train trl``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl", reason="the trl extra is part of `all`: `make test` installs it")

from searchgym.agents.grpo.config import LLDSConfig  # noqa: E402
from searchgym.agents.grpo.losses import llds_loss  # noqa: E402
from searchgym.agents.integrations.config import TRLConfig, parse_trl_args  # noqa: E402
from searchgym.agents.integrations.trl import (  # noqa: E402
    LLDSGRPOTrainer,
    LLDSInactiveWarning,
    LLDWarningCallback,
    SearchQARollout,
    SearchQAToolEnv,
    check_trl_overrides,
    episode_reward,
    question_dataset,
    trl_args,
)
from searchgym.agents.integrations.trl_train import end_processes  # noqa: E402
from searchgym.agents.llm import tiny_causal_lm, token_logprobs  # noqa: E402
from searchgym.envs.spec import EnvSpec  # noqa: E402
from searchgym.errors import ConfigError, SearchGymError  # noqa: E402
from searchgym.protocol import Source  # noqa: E402
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


def _trainer(
    tok: Any,
    tmp_path: Path,
    *,
    minibatch: int = 2,
    iterations: int = 2,
    micro_batch_size: int | None = None,
    loss_type: str = "dapo",
    **llds: Any,
) -> Any:
    config = TRLConfig(
        run_dir=str(tmp_path / "trl"),
        questions_per_step=2,
        group_size=2,
        minibatch_size=minibatch,
        micro_batch_size=micro_batch_size,
        epochs=iterations,
        loss_type=loss_type,  # type: ignore[arg-type]
        kl_coef=0.0,
        updates=2,
        progress=False,
        **ENV,
    )
    rollout = SearchQARollout(config.env, tok, seed=0)
    trainer = LLDSGRPOTrainer(
        model=_model(tok),
        reward_funcs=[episode_reward],
        args=trl_args(config),
        train_dataset=question_dataset(rollout.env(4)),
        processing_class=tok.to_transformers(),
        rollout_func=rollout,
        llds=LLDSConfig(**llds),
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
        # TRL's count spans the whole generation batch (steps_per_generation micro-batches like this one).
        "num_items_in_batch": torch.tensor(2 * sum(mask) * trainer.args.steps_per_generation),
    }
    # pi_old: the current policy's log-probs, shifted so that some tokens lost likelihood (d > 0).
    full = torch.cat([inputs["prompt_ids"], ids], dim=1)
    with torch.no_grad():
        logp, _ = token_logprobs(trainer.model, full, torch.ones_like(full), vocab_size=tok.vocab_size)
    shift = torch.linspace(-0.3, 0.5, c).expand(2, c)
    inputs["old_per_token_logps"] = logp[:, n:] + shift
    return inputs, demo


def test_rollout_func_returns_the_env_transcripts(tok: Any) -> None:
    rollout = SearchQARollout(EnvSpec(**ENV), tok, seed=3)
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

    rollout = SearchQARollout(EnvSpec(**ENV), tok)
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
    from searchgym.agents.grpo.losses import answer_weights
    from searchgym.agents.grpo.spans import answer_span_mask

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


def _rows(inputs: dict[str, Any], i: int) -> dict[str, Any]:
    """Response ``i`` of TRL's loss inputs as a micro-batch of one."""
    return {k: v[i : i + 1] if isinstance(v, torch.Tensor) and v.dim() else v for k, v in inputs.items()}


def _llds_share(trainer: Any, inputs: dict[str, Any]) -> float:
    """What LLDS adds to the micro-batch's loss, over lambda: the loss with LLDS minus the loss without."""
    llds = trainer.llds
    with_llds = trainer._compute_loss(trainer.model, dict(inputs))
    trainer.llds = dataclasses.replace(llds, coef=0.0)
    without = trainer._compute_loss(trainer.model, dict(inputs))
    trainer.llds = llds
    return float(with_llds - without) / llds.coef


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_llds_under_gradient_accumulation_adds_up_to_the_whole_update(
    tok: Any, tmp_path: Path, loss_type: str
) -> None:
    """--micro-batch: the shares of the accumulated micro-batches add up to the mini-batch's LLDS term."""
    whole = _trainer(tok, tmp_path, loss_type=loss_type, gate="action", coef=0.2)
    split = _trainer(tok, tmp_path, loss_type=loss_type, micro_batch_size=1, gate="action", coef=0.2)
    assert (whole.args.per_device_train_batch_size, whole.args.gradient_accumulation_steps) == (2, 1)
    assert (split.args.per_device_train_batch_size, split.args.gradient_accumulation_steps) == (1, 2)
    assert whole.updates_per_rollout == split.updates_per_rollout == 4  # 2 mini-batches x 2 passes
    whole.model.train()
    split.model.train()
    inputs, _ = _oracle_inputs(tok, whole)  # the same generation batch (and token count) for both
    expected = _llds_share(whole, inputs)
    parts = [_llds_share(split, _rows(inputs, i)) for i in range(2)]
    assert expected > 0
    assert sum(parts) == pytest.approx(expected, rel=1e-5)
    # Logged: the update's term, whatever the micro-batching (the mean of the micro-batches' records).
    logged = split._metrics["train"]["train/llds_loss"][-4::2]  # the two with LLDS on
    assert sum(logged) / 2 == pytest.approx(whole.llds_last["llds_loss"], rel=1e-5)


def test_batch_sizes_keep_their_meaning_across_processes() -> None:
    """questions_per_step and minibatch_size count responses over all processes; TRL's sizes are divided."""
    config = TRLConfig(questions_per_step=4, group_size=2, minibatch_size=4, progress=False)
    assert config.batch.process_batches(1) == (4, 1, 2)  # (per device, accumulation, steps per generation)
    assert config.batch.process_batches(2) == (2, 1, 2)
    assert config.batch.process_batches(4) == (1, 1, 2)
    micro = TRLConfig(
        questions_per_step=4, group_size=2, minibatch_size=4, micro_batch_size=1, progress=False
    )
    assert micro.batch.process_batches(2) == (1, 2, 4)
    for processes in (1, 2):
        per_device, accumulation, steps = micro.batch.process_batches(processes)
        assert per_device * processes * steps == micro.batch.batch_size  # TRL's generation batch
        assert per_device * processes * accumulation == micro.batch.minibatch_responses  # one update
    with pytest.raises(ConfigError, match="multiple of the number of processes"):
        config.batch.process_batches(3)
    with pytest.raises(ConfigError, match="micro_batch_size 3 must be >= 1 and divide"):
        TRLConfig(questions_per_step=4, group_size=2, minibatch_size=4, micro_batch_size=3)
    args = trl_args(config, num_processes=1)
    assert (args.generation_batch_size, args.steps_per_generation) == (8, 2)


def test_trl_arg_passes_other_grpo_config_fields(tmp_path: Path) -> None:
    overrides = parse_trl_args(["gradient_checkpointing=true", "optim=adamw_torch", "top_p=0.9"])
    assert overrides == {"gradient_checkpointing": True, "optim": "adamw_torch", "top_p": 0.9}
    check_trl_overrides(overrides)
    args = trl_args(TRLConfig(run_dir=str(tmp_path), progress=False), **overrides)
    assert args.gradient_checkpointing is True and args.optim == "adamw_torch" and args.top_p == 0.9
    with pytest.raises(ConfigError, match="searchgym sets it from --lr"):
        check_trl_overrides({"learning_rate": 1.0})
    with pytest.raises(ConfigError, match="did you mean gradient_checkpointing"):
        check_trl_overrides({"gradient_checkpointin": True})
    with pytest.raises(ConfigError, match="key=value"):
        parse_trl_args(["gradient_checkpointing"])


def test_rollouts_generate_through_trls_unwrap_helper(tok: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """Turns come from the model TRL's unwrap_model_for_generation yields (ZeRO-3 gather, FSDP), as in TRL."""
    import trl.models

    trainer = _trainer(tok, tmp_path)
    real = trl.models.unwrap_model_for_generation
    entered: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def spy(model: Any, accelerator: Any, **kwargs: Any) -> Any:
        with real(model, accelerator, **kwargs) as unwrapped:
            entered.append({"kwargs": kwargs, "model": unwrapped})
            yield unwrapped

    monkeypatch.setattr(trl.models, "unwrap_model_for_generation", spy)
    rollout = trainer.rollout_func
    qid = rollout.env(1).questions[0].id
    out = rollout([qid, qid], trainer)
    assert len(out["completion_ids"]) == 2
    assert len(entered) == 1 and entered[0]["kwargs"]["gather_deepspeed3_params"] is True
    assert rollout._policy is not None and rollout._policy.model is entered[0]["model"]


def test_shared_env_options_reach_the_episodes(tok: Any) -> None:
    """--max-obs-tokens, --reward and --prompt-style reach the env the rollouts play."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from searchgym.protocol import format_prompt
    from searchgym.tokenization import load_tokenizer

    config = TRLConfig(max_obs_tokens=6, reward="f1", progress=False, **ENV)
    rollout = SearchQARollout(config.env, tok)
    qid = rollout.env(1).questions[0].id
    trainer = SimpleNamespace(
        model=_model(tok), accelerator=SimpleNamespace(process_index=0), temperature=1.0
    )
    out = rollout([qid, qid], trainer)
    assert rollout.env(2).env_spec.reward == "f1"
    for mask in out["env_mask"]:  # every tool observation is cut to 6 tokens
        runs = "".join(map(str, mask)).split("1")
        assert all(len(run) <= 6 for run in runs)
    hf = tok.to_transformers()
    hf.chat_template = qwen2_5_chat_template
    chat_tok = load_tokenizer(hf)
    chat = SearchQARollout(TRLConfig(prompt_style="chat", **ENV).env, chat_tok)
    out = chat([qid], trainer)
    question = chat.env(1).questions[0].question
    assert out["prompt_ids"][0] == chat_tok.chat_prompt_ids(format_prompt(question))
    assert "<|im_start|>user" in chat_tok.decode(out["prompt_ids"][0])


def test_tool_env_trains_inside_grpo_trainer(scripted_tool_grpo: Any) -> None:
    """SearchQAToolEnv as TRL's environment_factory: TRL calls its tools and reward in a real step."""
    trainer, model = scripted_tool_grpo(SearchQAToolEnv.factory(topk=1, max_turns=3))
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["tools/call_frequency"] == 2.0 and logs["tools/failure_frequency"] == 0.0
    assert logs["rewards/SearchQAToolEnv/mean"] == 0.5  # get_reward: exact match of the answer tool's call
    infos = [env.info for env in trainer._environment_pool[None]]
    assert [i["em"] for i in infos] == [1.0, 0.0, 1.0, 0.0] and all(i["searches"] == 1 for i in infos)
    assert any(0 in row for row in trainer._buffered_inputs[0]["tool_mask"].tolist())  # tool results masked
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_tool_env_contract() -> None:
    """The public methods TRL exposes as tools are search and answer; errors reach the model as text."""
    import inspect

    env = SearchQAToolEnv.factory(topk=2, max_turns=2)()
    public = {n for n, _ in inspect.getmembers(type(env), inspect.isfunction) if not n.startswith("_")}
    assert public == {"reset", "get_reward", "search", "answer"}
    qid = env._questions[3].id
    assert env.reset(question_id=qid).endswith(env._by_id[qid].question.strip().rstrip("?") + "?")
    assert env.get_reward() == 0.0
    assert env.search("anything").startswith("<information>Doc 1(Title: ")
    with pytest.raises(SearchGymError, match="no searches left"):
        env.search("again")
    env.answer(env.question.golden_answers[0].upper())
    assert env.get_reward() == 1.0  # SQuAD-normalised exact match, as the env's reward
    with pytest.raises(SearchGymError, match="already answered"):
        env.answer("twice")
    f1_env = SearchQAToolEnv.factory(reward="f1")()
    f1_env.reset(question_id=qid)
    f1_env.answer("x " + f1_env.question.golden_answers[0])
    assert 0 < f1_env.get_reward() < 1


def test_exported_trl_rows_are_what_trls_rollout_func_returns(tok: Any, tmp_path: Path) -> None:
    """export-trajectories --format trl rows, replayed as a rollout_func, go through a real TRL step."""
    import datasets
    import trl

    from searchgym.agents.integrations.export import export_trajectories
    from searchgym.agents.integrations.trajectories import iter_jsonl

    path = tmp_path / "traj.jsonl"
    assert export_trajectories(path, fmt="trl", episodes=4, group_size=2, batch=4, spec=EnvSpec(**ENV)) == 4
    rows = list(iter_jsonl(path))

    def replay(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        assert prompts == [r["question_id"] for r in rows]  # TRL's sampler repeats each question G times
        return {key: [r[key] for r in rows] for key in rows[0]}

    def reward(completions: Any, reward: list[float], **_: Any) -> list[float]:
        return reward

    config = TRLConfig(
        run_dir=str(tmp_path / "trl"),
        questions_per_step=2,
        group_size=2,
        minibatch_size=4,
        epochs=1,
        updates=1,
        kl_coef=0.0,
        progress=False,
        **ENV,
    )
    trainer = trl.GRPOTrainer(
        model=_model(tok),
        reward_funcs=[reward],
        args=trl_args(config, shuffle_dataset=False),
        train_dataset=datasets.Dataset.from_dict({"prompt": [r["question_id"] for r in rows[::2]]}),
        processing_class=tok.to_transformers(),
        rollout_func=replay,
    )
    trainer.train()
    batch = trainer._buffered_inputs[0]
    lengths = batch["completion_mask"].sum(dim=1).tolist()
    masks = sorted(tuple(m[: int(n)]) for m, n in zip(batch["tool_mask"].tolist(), lengths, strict=True))
    assert masks == sorted(tuple(r["env_mask"]) for r in rows)  # env_mask became TRL's tool_mask


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Two CPU processes under torch.distributed.run (gloo), one thread each."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_port", str(_free_port()), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    out = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def test_end_processes_takes_the_process_group_down(tmp_path: Path) -> None:
    """The CLI's last act under torchrun: without it a gloo process can abort in its teardown."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist.is_initialized()
        end_processes()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    end_processes()  # no group: nothing to do


@pytest.mark.slow
def test_vllm_requests_are_padded_across_processes(tmp_path: Path) -> None:
    """TRL's server mode with 2 processes whose episodes need 1 and 2 turns (2 and 3 episodes)."""
    worker = Path(__file__).with_name("trl_vllm_worker.py")
    _torchrun([str(worker), str(tmp_path)], tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["episodes"] for r in ranks] == [2, 3]
    assert ranks[0]["searches"] == [0, 0] and ranks[1]["searches"] == [1, 1, 1]
    assert ranks[0]["prompt_lengths"][0] != ranks[1]["prompt_lengths"][0]  # a mix-up would show
    assert all(ranks[0]["answers_match_contexts"]) and all(ranks[1]["answers_match_contexts"])


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


SMOKE = ["--questions-per-step", "2", "--group-size", "2", "--tiny-layers", "1", "--tiny-hidden", "32"]
SMOKE += ["--no-progress", "--max-turn-tokens", "16", "--max-context-tokens", "320"]


@pytest.mark.slow
def test_train_trl_on_two_processes(tmp_path: Path) -> None:
    """torchrun, 2 processes: one metrics line per step from the main process, 4 responses per step."""
    run = tmp_path / "run"
    argv = ["-m", "searchgym.app.cli", "train", "trl", "--run-dir", str(run), "--updates", "2", *SMOKE]
    out = _torchrun([*argv, "--eval-questions", "2", "--eval-batch", "2"], tmp_path)
    records = _records(run)
    steps = [r for r in records if "train/llds_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]  # each step once (not once per process)
    assert [r["rollout/episodes"] for r in steps if "rollout/episodes" in r] == [4.0]  # 2 questions x G 2
    assert steps[1]["lld/delta_adv_zero"] is not None  # the batch's LLD, at its last update
    assert sum("eval/em" in r for r in records) == 1
    assert out.stdout.count('"run_dir"') == 1  # one summary line, from the main process
    assert (run / "model" / "config.json").is_file()


def test_train_trl_end_to_end_saves_and_resumes(tmp_path: Path, capsys: Any) -> None:
    from searchgym.app.cli import main

    run = tmp_path / "run"
    argv = ["train", "trl", "--run-dir", str(run), *SMOKE, "--eval-questions", "0"]
    argv += ["--save-every", "2", "--max-obs-tokens", "40", "--reward", "f1"]
    argv += ["--trl-arg", "shuffle_dataset=false"]
    assert main([*argv, "--updates", "2"]) == 0
    steps = [r for r in _records(run) if "train/llds_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # A 2-step run (one rollout batch of 2 updates) logs its LLD: flushed at the batch's last update.
    assert "lld/delta_adv_zero" not in steps[0] and steps[1]["lld/delta_adv_zero"] is not None
    assert (run / "checkpoint-2").is_dir() and (run / "model" / "config.json").is_file()
    assert main([*argv, "--updates", "3"]) != 0  # a new run in a folder that holds one is refused
    assert "already holds" in capsys.readouterr().err
    assert main([*argv, "--updates", "3", "--resume", "--eval-questions", "2", "--eval-batch", "2"]) == 0
    records = _records(run)
    steps = [r for r in records if "train/llds_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]  # continued from checkpoint-2, nothing repeated
    # Training stopped in the middle of a rollout batch: its LLD is flushed at the end, not lost.
    assert steps[-1]["lld/delta_adv_zero"] is not None
    assert "eval/em" in records[-1]


def test_missing_trl_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['trl'] = None\n"
        "from searchgym.errors import MissingDependencyError\n"
        "try:\n    import searchgym.agents.integrations.trl\n"
        "except MissingDependencyError as e:\n    print(e.extra)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "trl"
