"""searchgym inside TRL's ``GRPOTrainer``: token-exact SearchQA rollouts, LLDS, and the LLD early warning.

Three pieces, usable separately (see ``docs/scale.md``):

* :class:`SearchQARollout` — a ``rollout_func`` for ``GRPOTrainer(rollout_func=...)``. It plays each
  prompt (a question id of the env's split) as one SearchQA episode through the native vector env (one
  batched retrieval call per turn), generating each turn with the trainer's own model (searchgym's
  :class:`~searchgym.agents.llm.LLMPolicy`, KV cache, token-exact stops) or with TRL's vLLM backend when
  ``use_vllm`` is on. It returns the ids the policy sampled, their log-probabilities, ``env_mask`` (1 on
  policy tokens, 0 on tool output: TRL multiplies it into the loss mask) and the episodes' rewards, EM, F1
  and searches as extra fields for the reward functions (:func:`episode_reward`, :func:`episode_em`).
* :class:`LLDSGRPOTrainer` — ``GRPOTrainer`` plus the LLDS term of :func:`searchgym.agents.grpo.losses.llds_loss`
  (action, response or token gate; LLDS-MA), computed on the gradient-carrying log-probabilities TRL's loss
  uses, plus the LLD diagnostic ``lld/delta_adv_*`` of each rollout batch. It warns (:class:`LLDSInactiveWarning`)
  when each rollout batch makes a single optimizer update: TRL then uses the detached current
  log-probabilities as ``pi_old`` and LLDS is identically zero.
* :class:`LLDWarningCallback` — a ``TrainerCallback`` that applies
  :func:`searchgym.agents.grpo.diagnostics.lld_warning` to the logged ``lld/delta_adv_pos`` and logs
  ``lld/warning``.

:func:`train_trl` wires them together for ``searchgym train trl``.

Verified against TRL 1.16.0 (``trl/trainer/grpo_trainer.py``): ``rollout_func(prompts, trainer)`` gets the
process's prompts as the sampler produced them (each repeated ``num_generations`` times, consecutively) and
must return one completion per prompt; ``env_mask`` becomes ``tool_mask`` only when ``tools`` is not set;
``old_per_token_logps`` is kept only when a rollout batch serves more than one optimizer update.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

try:
    import torch
    import transformers
    import trl
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError(getattr(e, "name", None) or "trl", "trl", "The TRL integration") from e

from searchgym.agents.grpo.diagnostics import lld_warning
from searchgym.agents.grpo.losses import (
    Gate,
    adaptive_answer_weight,
    answer_span_mask,
    answer_weights,
    displacement_by_advantage,
    llds_loss,
)
from searchgym.agents.grpo.rollout import RolloutBatch, collect_rollouts, evaluate_policy
from searchgym.agents.llm import LLMPolicy, Segment
from searchgym.envs.episode import Source
from searchgym.envs.vector import SearchQAVectorEnv
from searchgym.errors import ConfigError
from searchgym.tokenization import Tokenizer

from .config import TRLConfig
from .trajectories import episodes_from_batch

__all__ = [
    "LLDSGRPOTrainer",
    "LLDSInactiveWarning",
    "LLDSOptions",
    "LLDWarningCallback",
    "SearchQARollout",
    "episode_em",
    "episode_f1",
    "episode_reward",
    "question_dataset",
    "train_trl",
    "trl_args",
]

_POLICY, _TOOL = int(Source.POLICY), int(Source.TOOL)


# -- rollouts ------------------------------------------------------------------------------------------


class _VLLMTurns:
    """One turn per context through TRL's vLLM backend (``trainer.vllm_generation``).

    vLLM stops on the tag strings (``generation_kwargs`` set by :func:`trl_args`); the env then consumes the
    segment up to the token where the turn really ends (``SegmentStep.consumed``) and drops the rest, so
    the transcript stays token-exact whatever vLLM's stop handling does.
    """

    def __init__(self, vllm_generation: Any) -> None:
        self.vllm = vllm_generation

    def clear_cache(self) -> None:
        """Nothing to drop: vLLM manages its own cache (the rollout loop calls this between batches)."""

    def rollout_segments(self, observations: Sequence[Any]) -> list[Segment]:
        contexts = [[int(t) for t in o["tokens"][: int(o["length"][0])]] for o in observations]
        _, completion_ids, logprobs, _ = self.vllm.generate(prompts=contexts, images=None, num_generations=1)
        segments = []
        for ids, lps in zip(completion_ids, logprobs, strict=True):
            # vLLM gives a list per position (the sampled token first); None where it could not score.
            values = [float("nan") if not lp or lp[0] is None else float(lp[0]) for lp in lps]
            segments.append(Segment(tokens=list(ids), logprobs=torch.tensor(values), stop=""))
        return segments


class SearchQARollout:
    """A TRL ``rollout_func`` that plays SearchQA episodes, one per prompt.

    Each prompt is a question id of the env's split (see :func:`question_dataset`); the episode's own
    prompt (Search-R1's template, in the policy's tokenizer) becomes ``prompt_ids``, and the rest of the
    transcript — policy turns and tool output — ``completion_ids``, with ``env_mask`` 1 on the policy's
    tokens. Extra fields, one value per completion, reach the reward functions: ``searchgym_reward``,
    ``searchgym_em``, ``searchgym_f1``, ``searchgym_searches``.

    Args:
        env_kwargs: Keyword arguments of :class:`~searchgym.envs.vector.SearchQAVectorEnv` (dataset, split,
            tokenizer, retriever, topk, turn and context budgets), e.g. ``CommonConfig.env_kwargs()``.
        seed: Seed of the rollout policy's sampling generator.

    Attributes:
        last_batch: The last call's episodes (a :class:`~searchgym.agents.grpo.rollout.RolloutBatch`).
    """

    def __init__(self, env_kwargs: dict[str, Any], *, seed: int = 0) -> None:
        self.env_kwargs = dict(env_kwargs)
        self.seed = seed
        self.calls = 0
        self.last_batch: RolloutBatch | None = None
        self._envs: dict[int, SearchQAVectorEnv] = {}
        self._policy: LLMPolicy | None = None

    def env(self, num_envs: int) -> SearchQAVectorEnv:
        """The vector env for ``num_envs`` episodes at a time (built once per size)."""
        if num_envs not in self._envs:
            self._envs[num_envs] = SearchQAVectorEnv(num_envs, autoreset_mode="Disabled", **self.env_kwargs)
        return self._envs[num_envs]

    def _turns(self, trainer: Any, env: SearchQAVectorEnv) -> Any:
        if getattr(trainer, "use_vllm", False):
            return _VLLMTurns(trainer.vllm_generation)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self._policy is None or self._policy.model is not model:
            rank = int(getattr(trainer.accelerator, "process_index", 0))
            self._policy = LLMPolicy(
                model,
                env.tokenizer,
                temperature=float(getattr(trainer, "temperature", 1.0)),
                max_turn_tokens=env.config.max_turn_tokens,
                seed=self.seed + 7919 * rank,
            )
        return self._policy

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """Plays one episode per prompt; returns TRL's rollout dict (see the class docstring)."""
        ids = [str(p) for p in prompts]
        env = self.env(len(ids))
        turns = self._turns(trainer, env)
        # Pinned questions, one sub-env each: correct whether or not this process holds whole groups.
        batch = collect_rollouts(
            env,
            cast(LLMPolicy, turns),
            seed=self.seed + self.calls,
            group_size=1,
            question_ids=ids,
        )
        self.calls += 1
        self.last_batch = batch
        episodes = episodes_from_batch(batch)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.response_ids for e in episodes],
            "logprobs": [e.response_logprobs for e in episodes],
            "env_mask": [e.response_mask for e in episodes],
            "searchgym_reward": [e.reward for e in episodes],
            "searchgym_em": [float(e.info["em"]) for e in episodes],
            "searchgym_f1": [float(e.info["f1"]) for e in episodes],
            "searchgym_searches": [float(e.info["searches"]) for e in episodes],
        }


def episode_reward(completions: Sequence[Any], searchgym_reward: Sequence[float], **_: Any) -> list[float]:
    """TRL reward function: the env's episode reward (its metric; exact match by default)."""
    return [float(r) for r in searchgym_reward]


def episode_em(completions: Sequence[Any], searchgym_em: Sequence[float], **_: Any) -> list[float]:
    """TRL reward function: the episode's exact match."""
    return [float(r) for r in searchgym_em]


def episode_f1(completions: Sequence[Any], searchgym_f1: Sequence[float], **_: Any) -> list[float]:
    """TRL reward function: the episode's token F1."""
    return [float(r) for r in searchgym_f1]


def question_dataset(env: SearchQAVectorEnv) -> Any:
    """The env split's questions as a ``datasets.Dataset`` with ``prompt`` = question id (and ``question``)."""
    import datasets

    return datasets.Dataset.from_dict(
        {"prompt": [q.id for q in env.questions], "question": [q.question for q in env.questions]}
    )


# -- LLDS in TRL's loss --------------------------------------------------------------------------------


class LLDSInactiveWarning(UserWarning):
    """LLDS is configured but identically zero: each rollout batch makes a single optimizer update."""


@dataclass
class LLDSOptions:
    """The LLDS term added to TRL's loss.

    Attributes:
        gate: ``"action"``, ``"response"``, ``"token"``, or ``None`` for no LLDS (diagnostics still logged).
        coef: lambda.
        ma: LLDS-MA: weight the final answer span by ``beta``.
        ma_beta: Constant ``beta``; ``None``: adaptive from the rollout batch's mean valid searches.
        ma_schedule: The adaptive schedule (``"code"`` or ``"paper"``, :func:`adaptive_answer_weight`).
    """

    gate: Gate | None = "action"
    coef: float = 0.2
    ma: bool = False
    ma_beta: float | None = None
    ma_schedule: str = "code"

    @property
    def enabled(self) -> bool:
        """Whether the term is in the loss."""
        return self.gate is not None and self.coef > 0


class LLDWarningCallback(transformers.TrainerCallback):
    """Applies the LLD early-warning rule to TRL's logs and logs ``lld/warning``.

    Each log holding ``lld/delta_adv_pos`` (one per rollout batch, from :class:`LLDSGRPOTrainer`) is one
    record of :func:`~searchgym.agents.grpo.diagnostics.lld_warning`'s history. When the rule fires
    (``delta_adv_pos <= 0`` on ``window`` consecutive rollout batches) the log gets ``lld/warning = 1``
    and a Python warning is issued once per streak. Put it before the reporting callbacks (the trainer
    does) so that they record ``lld/warning`` too.

    Args:
        window: Consecutive rollout batches required.

    Attributes:
        history: The records seen, oldest first.
        fired_at: The global steps at which the rule fired.
    """

    def __init__(self, window: int = 3) -> None:
        if window < 1:
            raise ConfigError(f"window must be >= 1, got {window}")
        self.window = window
        self.history: list[dict[str, Any]] = []
        self.fired_at: list[int] = []

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        if not logs or logs.get("lld/delta_adv_pos") is None:
            return
        self.history.append({"step": state.global_step, "lld/delta_adv_pos": logs["lld/delta_adv_pos"]})
        fired = lld_warning(self.history, self.window)
        logs["lld/warning"] = float(fired)
        if fired:
            if not self.fired_at or self.fired_at[-1] != self.history[-2]["step"]:
                warnings.warn(
                    f"LLD early warning at step {state.global_step}: the log-likelihood of positively "
                    f"rewarded responses did not rise on {self.window} consecutive rollout batches "
                    "(lld/delta_adv_pos <= 0), the precursor of GRPO collapse; consider LLDS (--llds action)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self.fired_at.append(int(state.global_step))


class LLDSGRPOTrainer(trl.GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the LLDS regulariser and the LLD diagnostics.

    The loss is TRL's (its ``loss_type``, clipping, KL, entropy) plus ``coef * L_LLDS`` where ``L_LLDS`` is
    :func:`~searchgym.agents.grpo.losses.llds_loss` on the same micro-batch: the log-probabilities TRL's loss
    is built on (with their gradients), TRL's ``pi_old`` (``old_per_token_logps``), TRL's per-response
    advantages and its loss mask (completion mask × ``env_mask``). Like TRL's ``bnpo``/``grpo`` terms it is a
    token mean over the micro-batch's policy tokens divided by the gradient-accumulation steps.

    Metrics (in TRL's logs): ``train/llds_loss``, ``train/llds_gate_open`` (every micro-batch, even with
    LLDS off), ``train/llds_ma_beta``; ``rollout/em``, ``rollout/f1``, ``rollout/searches`` (from the
    :class:`SearchQARollout` fields); ``lld/delta_adv_pos`` / ``_zero`` / ``_neg``: each rollout batch's
    own responses re-scored after all of that batch's updates, minus their ``pi_old``
    (:func:`~searchgym.agents.grpo.losses.displacement_by_advantage`), logged at the first update of the
    next batch; ``lld/warning`` (:class:`LLDWarningCallback`).

    Args:
        *args: ``GRPOTrainer``'s.
        llds: The LLDS term (default: action gate, lambda 0.2).
        tokenizer: The searchgym tokenizer of the env (needed for LLDS-MA's answer span).
        warning_window: Window of :class:`LLDWarningCallback` (``None``: no callback).
        **kwargs: ``GRPOTrainer``'s.
    """

    def __init__(
        self,
        *args: Any,
        llds: LLDSOptions | None = None,
        tokenizer: Tokenizer | None = None,
        warning_window: int | None = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.llds = llds if llds is not None else LLDSOptions()
        if self.llds.gate is not None and self.llds.gate not in ("action", "response", "token"):
            raise ConfigError(f"unknown LLDS gate {self.llds.gate!r}; valid gates: action, response, token")
        if self.llds.ma and tokenizer is None:
            raise ConfigError("LLDS-MA needs the env's searchgym tokenizer: pass tokenizer=")
        self.sg_tokenizer = tokenizer
        self._capture = False
        self.llds_logp: Tensor | None = None  # the last micro-batch's gradient-carrying log-probs
        self.llds_last: dict[str, float] = {}
        if self.llds.enabled and not self.llds_can_act:
            warnings.warn(
                f"LLDS is identically zero here: each rollout batch makes {self.updates_per_rollout:g} "
                "optimizer update, so TRL's pi_old is the current policy. Use num_iterations > 1, or "
                "steps_per_generation > gradient_accumulation_steps (several mini-batch updates per batch).",
                LLDSInactiveWarning,
                stacklevel=2,
            )
        if warning_window is not None:
            # First in line: the reporting callbacks then see lld/warning.
            self.callback_handler.callbacks.insert(0, LLDWarningCallback(warning_window))

    @property
    def updates_per_rollout(self) -> float:
        """Optimizer updates made with each rollout batch."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return float(generate_every / self.args.gradient_accumulation_steps)

    @property
    def llds_can_act(self) -> bool:
        """Whether ``pi_theta`` can differ from ``pi_old`` (more than one update per rollout batch)."""
        return self.updates_per_rollout > 1

    # -- the rollout batch -------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        # The rollout's extra fields were merged into ``inputs`` by TRL (one value per completion).
        for key in ("em", "f1", "searches"):
            values = [float(x[f"searchgym_{key}"]) for x in inputs if f"searchgym_{key}" in x]
            if values:
                self._metrics[mode][f"rollout/{key}"].append(sum(values) / len(values))
        if self.llds.ma:
            beta = self.llds.ma_beta
            if beta is None:
                searches = [float(x.get("searchgym_searches", 0.0)) for x in inputs]
                beta = adaptive_answer_weight(sum(searches) / max(len(searches), 1), self.llds.ma_schedule)
            mask = self._loss_mask(output)
            sources = torch.where(mask.bool(), _POLICY, _TOOL)
            assert self.sg_tokenizer is not None
            answer = answer_span_mask(output["completion_ids"], sources, self.sg_tokenizer.token_bytes)
            output["llds_weights"] = answer_weights(answer, beta)
            self._metrics[mode]["train/llds_ma_beta"].append(beta)
        return output

    @staticmethod
    def _loss_mask(inputs: dict[str, Any]) -> Tensor:
        mask: Tensor = inputs["completion_mask"]
        return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if self.model.training:
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self._step % generate_every == 0 and self._buffered_inputs is not None:
                self._log_displacement(self._buffered_inputs)
        result: dict[str, Any] = super()._prepare_inputs(generation_batch)
        return result

    @torch.no_grad()
    def _log_displacement(self, batches: Sequence[dict[str, Any]]) -> None:
        """LLD of the finished rollout batch: its responses re-scored now, against their ``pi_old``."""
        if any("llds_logp_before" not in b for b in batches):
            return
        before, after, adv, masks = [], [], [], []
        for b in batches:
            ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
            attention = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
            logp, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, b["completion_ids"].size(1)
            )
            before.append(b["llds_logp_before"])
            after.append(logp)
            adv.append(b["advantages"])
            masks.append(self._loss_mask(b))
        metrics = displacement_by_advantage(
            torch.cat(before), torch.cat(after), torch.cat(adv), torch.cat(masks)
        )
        for name in ("pos", "zero", "neg"):
            self._metrics["train"][f"lld/delta_adv_{name}"].append(metrics[f"delta_adv_{name}"])

    # -- the loss ----------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._capture:
            self.llds_logp = out[0]
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        self._capture = True
        try:
            loss: Tensor = super()._compute_loss(model, inputs)
        finally:
            self._capture = False
        logp = self.llds_logp
        assert logp is not None
        mask = self._loss_mask(inputs)
        old = inputs.get("old_per_token_logps")
        logp_old = logp.detach() if old is None else old
        # pi_old of this micro-batch, kept in the buffered batch for the displacement diagnostic.
        inputs.setdefault("llds_logp_before", logp_old.detach())
        advantages = inputs["advantages"]
        if advantages.dim() != 1:
            raise ConfigError("LLDS needs per-response advantages of shape (B,)")
        term, metrics = llds_loss(
            logp, logp_old, advantages, mask, self.llds.gate or "action", inputs.get("llds_weights")
        )
        mode = "train" if self.model.training else "eval"
        self.llds_last = metrics
        self._metrics[mode]["train/llds_loss"].append(metrics["llds_loss"])
        self._metrics[mode]["train/llds_gate_open"].append(metrics["llds_gate_open"])
        if self.llds.enabled:
            scale = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.llds.coef * term / scale
        return loss


# -- the command ---------------------------------------------------------------------------------------


def trl_args(config: TRLConfig, **overrides: Any) -> Any:
    """TRL's ``GRPOConfig`` for a :class:`TRLConfig` (``overrides`` win).

    One rollout batch (``questions_per_step * group_size`` responses) is TRL's generation batch; an
    optimizer update takes ``minibatch_size`` responses (``per_device_train_batch_size``, no gradient
    accumulation), so ``steps_per_generation = batch / minibatch``; ``num_iterations`` passes.
    """
    mb = config.minibatch_responses
    kwargs: dict[str, Any] = {
        "output_dir": config.run_dir,
        "max_steps": config.steps,
        "per_device_train_batch_size": mb,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": config.batch_size // mb,
        "num_generations": config.group_size,
        "num_iterations": config.num_iterations,
        "learning_rate": config.lr,
        "weight_decay": config.weight_decay,
        "warmup_steps": config.warmup_steps,
        "lr_scheduler_type": "constant_with_warmup" if config.lr_schedule == "constant" else "linear",
        "max_grad_norm": config.max_grad_norm if config.max_grad_norm > 0 else 1e9,
        "beta": config.kl_coef,
        "epsilon": config.clip_eps,
        "loss_type": config.loss_type,
        "temperature": config.temperature,
        "entropy_coef": config.entropy_coef,
        "seed": config.seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",  # metrics.jsonl and TensorBoard come from searchgym's MetricLogger
        "use_cpu": config.device == "cpu",
        "bf16": config.dtype == "bfloat16",
        "fp16": config.dtype == "float16",
        "disable_tqdm": not config.progress,
        "mask_truncated_completions": False,  # an episode ends on </answer>, not EOS: not a truncation
        "max_completion_length": config.max_turn_tokens,  # per vLLM call, i.e. per turn
        "use_vllm": config.use_vllm,
        "vllm_mode": config.vllm_mode,
        "dataloader_num_workers": 0,
    }
    if config.use_vllm:
        kwargs["generation_kwargs"] = {"stop": ["</search>", "</answer>"], "include_stop_str_in_output": True}
    return trl.GRPOConfig(**{**kwargs, **overrides})


class _MetricsCallback(transformers.TrainerCallback):
    """Writes TRL's training logs to ``RUN_DIR/metrics.jsonl`` (and TensorBoard) with searchgym's logger."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.last: dict[str, float] = {}

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        numbers = {
            k: float(v)
            for k, v in (logs or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if numbers:
            self.logger.log(int(state.global_step), numbers)
            self.last.update(numbers)


def train_trl(config: TRLConfig, **trl_overrides: Any) -> dict[str, float]:
    """``searchgym train trl``: GRPO (+LLDS) on SearchQA with TRL's ``GRPOTrainer``.

    Args:
        config: The run's configuration.
        **trl_overrides: Fields of TRL's ``GRPOConfig`` that win over :func:`trl_args`'s.

    Returns:
        The last logged metrics, plus ``eval/em``, ``eval/f1``, ``eval/searches`` when
        ``config.eval_questions`` > 0.
    """
    from searchgym.agents.grpo.runtime import MetricLogger, build_policy, prepare_run_dir

    run_dir = prepare_run_dir(config.run_dir, resume=False, overwrite=config.overwrite)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    policy, _ = build_policy(
        config, temperature=config.temperature, max_turn_tokens=config.max_turn_tokens, seed=config.seed
    )
    tokenizer = policy.tokenizer
    if config.kl_coef > 0 and (config.model is None or config.init is not None):
        # TRL builds its reference model from model.config.name_or_path: give it the initial weights.
        init_dir = run_dir / "init_model"
        policy.model.save_pretrained(str(init_dir))
        policy.model.config.name_or_path = str(init_dir)
    env_kwargs = {**config.env_kwargs(), "tokenizer": tokenizer}
    rollout = SearchQARollout(env_kwargs, seed=config.seed)
    dataset = question_dataset(rollout.env(config.batch_size))
    logger = MetricLogger(run_dir, tensorboard=config.tensorboard)
    metrics_cb = _MetricsCallback(logger)
    llds = LLDSOptions(
        gate=None if config.llds == "none" else config.llds,
        coef=config.llds_coef,
        ma=config.llds_ma,
        ma_beta=config.llds_ma_beta,
        ma_schedule=config.llds_ma_schedule,
    )
    trainer = LLDSGRPOTrainer(
        model=policy.model,
        reward_funcs=[episode_reward],
        args=trl_args(config, **trl_overrides),
        train_dataset=dataset,
        processing_class=tokenizer.to_transformers(),
        rollout_func=rollout,
        callbacks=[metrics_cb],
        llds=llds,
        tokenizer=tokenizer,
        warning_window=config.warning_window,
    )
    try:
        trainer.train()
        results = dict(metrics_cb.last)
        if config.eval_questions > 0:
            model = trainer.accelerator.unwrap_model(trainer.model)
            greedy = LLMPolicy(model, tokenizer, greedy=True, max_turn_tokens=config.max_turn_tokens)
            eval_env = SearchQAVectorEnv(
                config.eval_batch,
                autoreset_mode="Disabled",
                **{**config.env_kwargs(config.eval_split), "tokenizer": tokenizer},
            )
            summary = evaluate_policy(greedy, eval_env, config.eval_questions)
            evals = {f"eval/{k}": summary[k] for k in ("em", "f1", "searches")}
            logger.log(int(trainer.state.global_step), evals)
            results.update(evals)
            eval_env.close()
        if config.save_model:
            trainer.save_model(str(run_dir / "model"))
            tokenizer.to_transformers().save_pretrained(str(run_dir / "model"))
    finally:
        logger.close()
    return {k: v for k, v in results.items() if math.isfinite(v)}
