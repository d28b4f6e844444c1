"""The self-critical baseline's greedy episodes (``--advantage greedy``): the current policy plays each group's
question once by argmax decoding, apart from the sampled rollouts' env and generator."""

from __future__ import annotations

from searchgym.envs.spec import EnvSpec
from searchgym.envs.vector import SearchQAVectorEnv

from ..llm import LLMPolicy
from ..training.rollout import RolloutBatch, collect_rollouts

__all__ = ["GreedyPlayer"]


class GreedyPlayer:
    """Plays a batch's questions greedily, one episode per group, in group order.

    Its env and argmax policy are its own (built on first use), so the greedy episodes never touch the
    sampled rollouts' env or their sampling generator: a step's draws are the same with and without it.

    Args:
        policy: The trainer's sampling policy (its model, tokenizer and scoring options are shared).
        spec: The training env (the policy's tokenizer is its tokenizer).
        group_size: Responses per question in the batches it is given.
    """

    def __init__(self, policy: LLMPolicy, spec: EnvSpec, group_size: int) -> None:
        self.policy = policy
        self.spec = spec
        self.group_size = group_size
        self.max_turn_tokens = spec.max_turn_tokens
        self.env: SearchQAVectorEnv | None = None
        self.greedy: LLMPolicy | None = None

    def play(self, batch: RolloutBatch, seed: int) -> RolloutBatch:
        """The greedy episodes of ``batch``'s questions: their ``rewards`` (``(Q,)``) are the baseline.

        The questions are read from the batch's episodes, so a batch that ``filter_groups`` assembled from
        several draws gets its own groups' questions. All episodes run in one batch, the env reset with
        ``seed`` (which matters only to a faulty retriever), the model in eval mode and no gradient; argmax
        decoding draws no random number.

        Raises:
            RuntimeError: the responses of a group do not share one question.
        """
        ids = [str(info["question_id"]) for info in batch.infos]
        groups = [ids[g : g + self.group_size] for g in range(0, len(ids), self.group_size)]
        if any(len(set(group)) != 1 for group in groups):
            raise RuntimeError(f"a group's responses answer different questions: {groups}")
        if self.env is None or self.env.num_envs != len(groups):
            self.close()
            self.env = SearchQAVectorEnv(
                len(groups), self.spec, autoreset_mode="Disabled", tokenizer=self.policy.tokenizer
            )
        if self.greedy is None:
            p = self.policy
            self.greedy = LLMPolicy(
                p.model, p.tokenizer, greedy=True, max_turn_tokens=self.max_turn_tokens, scoring=p.scoring
            )
        model = self.policy.model
        mode = model.training
        model.eval()
        try:
            return collect_rollouts(
                self.env, self.greedy, seed=seed, group_size=1, question_ids=[group[0] for group in groups]
            )
        finally:
            model.train(mode)

    def close(self) -> None:
        """Closes the greedy env (a later :meth:`play` builds a new one)."""
        if self.env is not None:
            self.env.close()
            self.env = None
