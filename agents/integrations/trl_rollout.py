"""The TRL rollout side of searchgym: SearchQA episodes as a ``rollout_func`` (see :mod:`.trl`).

:class:`SearchQARollout` plays each prompt (a question id) as one SearchQA episode through the native vector
env, generating turns with the trainer's own model (inside TRL's ``unwrap_model_for_generation``) or with
TRL's vLLM backend, padded across processes (:class:`_VLLMTurns`). Re-exported by
:mod:`searchgym.agents.integrations.trl`, which documents the whole integration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError(getattr(e, "name", None) or "torch", "trl", "The TRL integration") from e

from searchgym.agents.llm import LLMPolicy, Segment
from searchgym.agents.training.rollout import RolloutBatch, collect_rollouts
from searchgym.envs.spec import EnvSpec
from searchgym.envs.vector import SearchQAVectorEnv
from searchgym.errors import ConfigError

from .trajectories import episodes_from_batch

__all__ = ["SearchQARollout", "episode_em", "episode_f1", "episode_reward", "question_dataset"]


class _VLLMTurns:
    """One turn per context through TRL's vLLM backend (``trainer.vllm_generation``).

    vLLM stops on the tag strings (``generation_kwargs`` set by :func:`trl_args`); the env then consumes the
    segment up to the token where the turn really ends (``SegmentStep.consumed``) and drops the rest, so
    the transcript stays token-exact whatever vLLM's stop handling does.

    Across processes, each turn is a *round*: the processes first agree on the largest number of running
    episodes (one ``gather``), every process pads its request to that count with a one-token dummy prompt,
    and the padding is dropped from the answer. A process whose episodes have all ended keeps taking part
    with dummies (:meth:`finish`) until every process is done. So every ``vllm_generation.generate`` call
    receives the same count on every process, as TRL's server mode (gather, then a slice of
    ``rank * count``) and colocated tensor parallelism (``all_gather_object`` in the group) require. Colocated
    vLLM without tensor parallelism generates each process's prompts alone and needs no padding.

    Args:
        vllm_generation: TRL's ``VLLMGeneration`` (``trainer.vllm_generation``).
        accelerator: The trainer's accelerator (``None``: one process).
    """

    def __init__(self, vllm_generation: Any, accelerator: Any = None) -> None:
        self.vllm = vllm_generation
        self.accelerator = accelerator
        processes = int(getattr(accelerator, "num_processes", 1)) if accelerator is not None else 1
        alone = getattr(vllm_generation, "mode", "server") == "colocate" and (
            int(getattr(vllm_generation, "tensor_parallel_size", 1)) == 1
        )
        self.pad = processes > 1 and not alone
        self.dummy: list[int] = [0]
        self.rounds = 0  # generate calls made (padding rounds included)

    def clear_cache(self) -> None:
        """Nothing to drop: vLLM manages its own cache (the rollout loop calls this between batches)."""

    def _largest_request(self, count: int) -> int:
        """The largest request of this round over all processes (a collective: every process calls it)."""
        local = torch.tensor([count], device=self.accelerator.device)
        return int(self.accelerator.gather(local).max())

    def _generate(self, contexts: list[list[int]]) -> tuple[list[list[int]], list[Any]]:
        self.rounds += 1
        _, completion_ids, logprobs, _ = self.vllm.generate(prompts=contexts, images=None, num_generations=1)
        return list(completion_ids), list(logprobs)

    def rollout_segments(self, observations: Sequence[Any]) -> list[Segment]:
        """One segment per observation (a running episode's transcript so far)."""
        contexts = [[int(t) for t in o["tokens"][: int(o["length"][0])]] for o in observations]
        n = len(contexts)
        if self.pad:
            self.dummy = contexts[0][:1]
            width = self._largest_request(n)
            contexts = contexts + [self.dummy] * (width - n)
        completion_ids, logprobs = self._generate(contexts)
        if len(completion_ids) != len(contexts):
            raise RuntimeError(
                f"vLLM returned {len(completion_ids)} completions for {len(contexts)} prompts of process "
                f"{getattr(self.accelerator, 'process_index', 0)}"
            )
        segments = []
        for ids, lps in zip(completion_ids[:n], logprobs[:n], strict=True):
            # vLLM gives a list per position (the sampled token first); None where it could not score.
            values = [float("nan") if not lp or lp[0] is None else float(lp[0]) for lp in lps]
            segments.append(Segment(tokens=list(ids), logprobs=torch.tensor(values), stop=""))
        return segments

    def finish(self) -> None:
        """Takes part, with dummy prompts, in the rounds of processes whose episodes are still running."""
        if not self.pad:
            return
        while (width := self._largest_request(0)) > 0:
            self._generate([self.dummy] * width)


@contextlib.contextmanager
def generation_model(trainer: Any) -> Iterator[Any]:
    """The trainer's model ready for generation, through TRL's own ``unwrap_model_for_generation``.

    As in TRL's generation path: DeepSpeed ZeRO-3 parameters are gathered (``ds3_gather_for_generation``),
    FSDP1's root parameters summoned, and gradient checkpointing is off while the turns are generated.
    A trainer without ``model_wrapped`` (a stand-in in tests) gives ``trainer.model`` as is.
    """
    wrapped = getattr(trainer, "model_wrapped", None)
    if wrapped is None:
        yield trainer.model
        return
    from trl.distributed import DistributedBackend
    from trl.models import unwrap_model_for_generation

    backend = DistributedBackend(trainer.accelerator)
    args = trainer.args
    processes = int(trainer.accelerator.num_processes)
    gathered = backend.is_zero3 and bool(getattr(args, "ds3_gather_for_generation", True))
    if processes > 1 and (backend.is_fsdp or (backend.is_zero3 and not gathered)):
        # Every forward of a sharded model is a collective, and episodes end at different turns on each
        # process: the processes would wait on each other forever.
        raise ConfigError(
            "searchgym's rollouts through the trainer's own model need full parameters on each process: "
            "with FSDP, or ZeRO-3 with ds3_gather_for_generation=False, generate with vLLM (--use-vllm)"
        )
    with (
        unwrap_model_for_generation(
            wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=bool(getattr(args, "ds3_gather_for_generation", True)),
            gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs", None),
        ) as model,
        backend.summon_full_params(wrapped, recurse=False),
    ):
        yield model


class SearchQARollout:
    """A TRL ``rollout_func`` that plays SearchQA episodes, one per prompt.

    Each prompt is a question id of the env's split (see :func:`question_dataset`); the episode's own
    prompt (Search-R1's template, in the policy's tokenizer) becomes ``prompt_ids``, and the rest of the
    transcript — policy turns and tool output — ``completion_ids``, with ``env_mask`` 1 on the policy's
    tokens. Extra fields, one value per completion, reach the reward functions: ``searchgym_reward``,
    ``searchgym_em``, ``searchgym_f1``, ``searchgym_searches``.

    Args:
        spec: The environment (a trainer's ``config.env``).
        tokenizer: The policy's tokenizer (an object or a name).
        seed: Seed of the rollout policy's sampling generator.

    Attributes:
        last_batch: The last call's episodes (a :class:`~searchgym.agents.training.rollout.RolloutBatch`).
    """

    def __init__(self, spec: EnvSpec, tokenizer: Any, *, seed: int = 0) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.seed = seed
        self.calls = 0
        self.last_batch: RolloutBatch | None = None
        self._envs: dict[int, SearchQAVectorEnv] = {}
        self._policy: LLMPolicy | None = None

    def env(self, num_envs: int) -> SearchQAVectorEnv:
        """The vector env for ``num_envs`` episodes at a time (built once per size)."""
        if num_envs not in self._envs:
            self._envs[num_envs] = SearchQAVectorEnv(
                num_envs, self.spec, autoreset_mode="Disabled", tokenizer=self.tokenizer
            )
        return self._envs[num_envs]

    def _policy_for(self, trainer: Any, env: SearchQAVectorEnv, model: Any) -> LLMPolicy:
        if self._policy is None or self._policy.model is not model:
            rank = int(getattr(trainer.accelerator, "process_index", 0))
            self._policy = LLMPolicy(
                model,
                env.tokenizer,
                temperature=float(getattr(trainer, "temperature", 1.0)),
                max_turn_tokens=env.env_spec.max_turn_tokens,
                seed=self.seed + 7919 * rank,
            )
        return self._policy

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """Plays one episode per prompt; returns TRL's rollout dict (see the class docstring)."""
        ids = [str(p) for p in prompts]
        env = self.env(len(ids))
        seed = self.seed + self.calls
        # Pinned questions, one sub-env each: correct whether or not this process holds whole groups.
        if getattr(trainer, "use_vllm", False):
            turns = _VLLMTurns(trainer.vllm_generation, getattr(trainer, "accelerator", None))
            batch = collect_rollouts(env, cast(LLMPolicy, turns), seed=seed, group_size=1, question_ids=ids)
            turns.finish()
        else:
            with generation_model(trainer) as model:
                policy = self._policy_for(trainer, env, model)
                batch = collect_rollouts(env, policy, seed=seed, group_size=1, question_ids=ids)
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
