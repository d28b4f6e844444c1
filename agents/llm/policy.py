"""The LLM policy: a :class:`SegmentAgent` that acts token by token or generates whole turns in batches.

:meth:`LLMPolicy.act` plays one token per call with a KV cache carried across calls;
:meth:`LLMPolicy.generate_segments` generates one turn for many contexts at once, each stopped exactly where
the environment stops it (a :class:`StopScanner` per sequence, the per-turn cap, the context size). The
model, the sampler, the scoring and the kept KV cache are in :mod:`.model`, :mod:`.sampling`,
:mod:`.scoring` and :mod:`.session`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from searchgym.envs.spec import EnvSpec
from searchgym.errors import ConfigError
from searchgym.protocol import Source, StopScanner
from searchgym.tokenization import Tokenizer, load_tokenizer

from ..base import Observation, SegmentAgent
from .model import ModelIO, load_pretrained, output_size, tiny_causal_lm
from .sampling import sample_tokens
from .scoring import DEFAULT_SCORING, ScoringOptions, token_logprobs
from .session import Prefill, Session, parameter_version

__all__ = ["LLMPolicy", "Segment"]


@dataclass
class Segment:
    """One generated turn.

    Attributes:
        tokens: The sampled ids, up to and including the token where the turn ends.
        logprobs: ``(len(tokens),)`` float32 log-probabilities of those ids under the rollout policy (at the
            sampling temperature).
        stop: Why generation stopped, with the environment's names: ``"</search>"``, ``"</answer>"``,
            ``"eos"``, ``"max_turn_tokens"`` or ``"context_limit"``.
    """

    tokens: list[int]
    logprobs: Tensor
    stop: str


def _trailing_policy_run(observation: Observation) -> tuple[list[int], int]:
    """The observation's context ids and how many of its last tokens the policy wrote in this turn."""
    n = int(observation["length"][0])
    tokens = observation["tokens"][:n]
    sources = observation["sources"][:n]
    not_policy = np.flatnonzero(sources != Source.POLICY)
    run = n - (int(not_policy[-1]) + 1 if len(not_policy) else 0)
    return [int(t) for t in tokens], run


class LLMPolicy(SegmentAgent):
    """A language-model policy for SearchQA environments.

    Args:
        model: A ``transformers`` causal LM (or anything with the same ``forward``); its output size must be
            at least the tokenizer's vocabulary size.
        tokenizer: The env's tokenizer (default: the built-in one).
        temperature: Sampling temperature (> 0); log-probabilities are of the tempered distribution.
        greedy: Take the most likely token instead of sampling.
        max_turn_tokens: The env's per-turn token cap (``SearchQAEnv(max_turn_tokens=...)``).
        seed: Seed of the policy's own sampling generator (re-seeded by ``reset(seed=...)``).
        top_p: Nucleus sampling threshold (1.0, the default: the whole tempered distribution, which is what
            a trainer's ratio assumes).
        reuse_cache: Keep each sequence's KV cache across :meth:`rollout_segments` calls, so a turn after a
            tool observation feeds the model only the new tokens (see :meth:`generate_segments`).
        scoring: How :meth:`token_logprobs` computes log-probabilities (a trainer scores through it too);
            its ``autocast_bf16`` also sets the precision of generation's forward passes.
        logit_noise: Standard deviation of Gaussian noise added to the logits before each sampled token (a
            sampler that disagrees with the model it samples for; 0: none). The reported log-probabilities
            are the noisy distribution's; greedy play and :meth:`token_logprobs` never see the noise.
    """

    name = "llm"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer | None = None,
        *,
        temperature: float = 1.0,
        greedy: bool = False,
        max_turn_tokens: int = EnvSpec.max_turn_tokens,
        seed: int = 0,
        top_p: float = 1.0,
        reuse_cache: bool = True,
        scoring: ScoringOptions = DEFAULT_SCORING,
        logit_noise: float = 0.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(None)
        if temperature <= 0:
            raise ConfigError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
        if max_turn_tokens < 1:
            raise ConfigError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
        if not 0.0 < top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
        if not (logit_noise >= 0 and math.isfinite(logit_noise)):
            raise ConfigError(f"logit_noise must be a finite number >= 0, got {logit_noise}")
        size = output_size(model)
        if size < self.tokenizer.vocab_size:
            raise ConfigError(
                f"the model outputs {size} logits but tokenizer {self.tokenizer.name!r} has "
                f"{self.tokenizer.vocab_size} ids; pass the tokenizer the model was trained with"
            )
        self.temperature = temperature
        self.greedy = greedy
        self.max_turn_tokens = max_turn_tokens
        self.top_p = top_p
        self.reuse_cache = reuse_cache
        self.scoring = scoring
        self._session: Session | None = None
        self._io = ModelIO(model)
        self._prefill = Prefill(self._io, self.tokenizer.pad_token_id)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)
        self.logit_noise = logit_noise
        self._noise_generator = torch.Generator(device=self.device)
        self._noise_generator.manual_seed(_noise_seed(seed))
        self._cache: Any = None
        self._cached_ids = np.zeros(0, dtype=np.int64)

    # -- construction ------------------------------------------------------------------------------------

    @classmethod
    def tiny(cls, tokenizer: Tokenizer | None = None, *, model_seed: int = 0, **kwargs: Any) -> LLMPolicy:
        """The offline default: :func:`tiny_causal_lm` over the (built-in) tokenizer's vocabulary.

        Args:
            tokenizer: Default: the built-in tokenizer.
            model_seed: Seed of the model's initialisation.
            **kwargs: Passed to :class:`LLMPolicy`.
        """
        tok = tokenizer if tokenizer is not None else load_tokenizer(None)
        model = tiny_causal_lm(
            tok.vocab_size, seed=model_seed, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        )
        return cls(model, tok, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        tokenizer: Any = None,
        *,
        dtype: Any = None,
        device: str | None = None,
        **kwargs: Any,
    ) -> LLMPolicy:
        """Loads a model (and, unless given, its tokenizer) by Hugging Face name or local path.

        Args:
            name_or_path: For ``AutoModelForCausalLM.from_pretrained``.
            tokenizer: Anything :func:`searchgym.tokenization.load_tokenizer` accepts; default the same
                name or path.
            dtype: Model dtype (e.g. ``torch.bfloat16``); default the checkpoint's.
            device: Where to put the model (``"cuda"``, ``"cpu"``…); default where it loads.
            **kwargs: Passed to :class:`LLMPolicy`.

        Raises:
            MissingDependencyError: ``transformers`` is not installed (the ``train`` extra).
        """
        model = load_pretrained(name_or_path, dtype=dtype, device=device)
        tok = load_tokenizer(tokenizer if tokenizer is not None else name_or_path)
        return cls(model, tok, **kwargs)

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        """The tokenizer's real vocabulary size: the only ids the policy ever writes."""
        return self.tokenizer.vocab_size

    # -- sampling ----------------------------------------------------------------------------------------

    def _sample(self, logits: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Draws one id per row of ``logits`` (B, V_model); returns ids (B,) and their log-probs (B,) under the
        distribution it drew from (with ``logit_noise``, the noisy one: what an engine would report)."""
        if self.logit_noise and not self.greedy:
            noise = torch.randn(logits.shape, generator=self._noise_generator, device=logits.device)
            logits = logits + self.logit_noise * noise.to(logits.dtype)
        return sample_tokens(
            logits,
            self.vocab_size,
            temperature=self.temperature,
            greedy=self.greedy,
            top_p=self.top_p,
            generator=generator or self._generator,
        )

    # -- Agent API (token level, KV cache) ---------------------------------------------------------------

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        """Starts an episode: drops the KV cache; ``seed`` re-seeds sampling."""
        super().reset(info, seed)
        self._pending = []
        self._cache = None
        self._cached_ids = np.zeros(0, dtype=np.int64)
        self._session = None
        if seed is not None:
            self._generator.manual_seed(seed)
            self._noise_generator.manual_seed(_noise_seed(seed))

    @torch.no_grad()
    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        """Samples the next token, feeding the model only the tokens it has not seen yet.

        The cache holds the context of the previous call; the new context normally extends it by the last
        sampled token plus any tool text. Anything else (a new episode without ``reset``) rebuilds it.
        """
        n = int(observation["length"][0])
        context = np.asarray(observation["tokens"][:n], dtype=np.int64)
        seen = len(self._cached_ids)
        if self._cache is not None and n > seen and np.array_equal(context[:seen], self._cached_ids):
            new = context[seen:]
        else:
            self._cache, new = None, context
        was_training = self.model.training
        self.model.eval()
        try:
            ids = torch.as_tensor(new, device=self.device).unsqueeze(0)
            with self.scoring.autocast(ids.device):
                logits, self._cache = self._io.forward(self.model, self._cache, True, input_ids=ids)
        finally:
            self.model.train(was_training)
        self._cached_ids = context.copy()
        return int(self._sample(logits)[0][0])

    # -- SegmentAgent API (batched turns) ----------------------------------------------------------------

    def generate(
        self, observations: Sequence[Observation], infos: Sequence[dict[str, Any]]
    ) -> list[list[int]]:
        """One turn per observation (see :meth:`rollout_segments`), ids only."""
        return [s.tokens for s in self.rollout_segments(observations)]

    def rollout_segments(self, observations: Sequence[Observation]) -> list[Segment]:
        """One turn per env observation, with log-probabilities.

        The context size comes from the observation's fixed length (``max_context_tokens``), and policy
        tokens already written in the current turn (after the last prompt or tool token) count towards the
        turn's cap and its closing tag, so each segment ends exactly where the env will end the turn.
        """
        if not observations:
            return []
        contexts, written = zip(*(_trailing_policy_run(o) for o in observations), strict=True)
        sizes = {int(o["tokens"].shape[0]) for o in observations}
        if len(sizes) != 1:
            raise ConfigError(f"observations of different context sizes {sorted(sizes)} in one batch")
        return self.generate_segments(
            list(contexts),
            turn_tokens=list(written),
            max_context_tokens=sizes.pop(),
            keep_cache=self.reuse_cache,
        )

    def clear_cache(self) -> None:
        """Drops the KV cache kept across turns (:meth:`generate_segments` with ``keep_cache``)."""
        self._session = None

    @torch.no_grad()
    def generate_segments(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        turn_tokens: Sequence[int] | None = None,
        max_context_tokens: int | None = None,
        generator: torch.Generator | None = None,
        keep_cache: bool = False,
    ) -> list[Segment]:
        """Generates one turn for every context at once.

        Contexts are left-padded into one batch; after one forward over the whole batch (identical contexts,
        such as the prompt a GRPO group shares, are read once), each step feeds one token per sequence
        through the KV cache. A sequence stops, with the env's rules and in the env's order, at the token
        where ``</search>`` or ``</answer>`` completes or at EOS, else when the turn reaches
        ``max_turn_tokens``, else when the context reaches ``max_context_tokens``. Finished sequences ride
        along (their tokens are discarded and masked out of attention) until all are done.

        With ``keep_cache``, the cache survives the call: when every context of the next call extends one
        of this call's sequences (its context plus the tokens it generated, then tool output), only the new
        tokens are fed, in a chunk whose padding is masked out, with each token's position counted as in
        a fresh forward; the tokens drawn and their log-probabilities are those of a fresh forward up to
        float rounding. Anything else (a context that extends nothing, a model whose parameters changed
        since, a model without a row-selectable cache) falls back to reading the contexts whole.

        Args:
            contexts: Token ids of each context (the whole transcript so far).
            turn_tokens: For each context, how many of its last tokens the policy already wrote in the
                current turn (default 0: every context ends with prompt or tool text).
            max_context_tokens: The env's context size; ``None`` for no limit.
            generator: Sampling generator (default the policy's own).
            keep_cache: Reuse the cache kept by the previous call where it applies, and keep this call's.

        Returns:
            One :class:`Segment` per context.
        """
        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ConfigError("every context needs at least one token")
        ctx: list[list[int]] = [[int(t) for t in c] for c in contexts]
        batch = len(ctx)
        written = list(turn_tokens) if turn_tokens is not None else [0] * batch
        scanners = [StopScanner(self.tokenizer.token_bytes, self.tokenizer.eos_token_id) for _ in ctx]
        for scanner, context, k in zip(scanners, ctx, written, strict=True):
            for prior in context[len(context) - k :] if k else ():
                scanner.feed(prior)
        budgets = []
        for context, k in zip(ctx, written, strict=True):
            budget = self.max_turn_tokens - k
            if max_context_tokens is not None:
                budget = min(budget, max_context_tokens - len(context))
            budgets.append(budget)

        out_ids: list[list[int]] = [[] for _ in ctx]
        out_logp: list[Tensor] = []
        stops = ["" for _ in ctx]
        for i, context in enumerate(ctx):
            if budgets[i] <= 0:  # the env would not ask for this turn; report why it is empty
                full = max_context_tokens is not None and len(context) >= max_context_tokens
                stops[i] = "context_limit" if full else "max_turn_tokens"

        session = self._session if keep_cache else None
        self._session = None  # consumed (its cache is updated in place), or stale
        was_training = self.model.training
        self.model.eval()
        autocast = self.scoring.autocast(self.device)  # the sampler reads the logits in float32
        try:
            with autocast:
                logits, cache, mask = self._prefill(self.model, session, ctx)
            next_pos = torch.tensor([[len(c)] for c in ctx], device=mask.device)
            fed = [len(c) for c in ctx]  # tokens of each row held in the cache
            for step in range(max(budgets)):
                if all(stops):
                    break
                token, logp = self._sample(logits, generator)
                out_logp.append(logp)
                for i, t in enumerate(token.tolist()):
                    if stops[i]:
                        continue
                    out_ids[i].append(t)
                    n = len(out_ids[i])
                    stops[i] = self._stop_reason(
                        scanners[i], t, written[i] + n, len(ctx[i]) + n, max_context_tokens
                    )
                if all(stops):
                    break
                # A row that had stopped before this token rides along, masked out.
                alive = [len(out_ids[i]) == step + 1 for i in range(batch)]
                for i in range(batch):
                    fed[i] += alive[i]
                column = torch.tensor(alive, dtype=mask.dtype, device=mask.device).unsqueeze(-1)
                mask = torch.cat([mask, column], dim=1)
                with autocast:
                    logits, cache = self._io.forward(
                        self.model,
                        cache,
                        True,
                        input_ids=token.unsqueeze(-1),
                        attention_mask=mask,
                        position_ids=next_pos,
                    )
                next_pos = next_pos + 1
        finally:
            self.model.train(was_training)
        if keep_cache and cache is not None:
            held = [c + ids[: fed[i] - len(c)] for i, (c, ids) in enumerate(zip(ctx, out_ids, strict=True))]
            self._session = Session(cache, mask, held, parameter_version(self.model))
        logps = torch.stack(out_logp, dim=1).float().cpu() if out_logp else torch.zeros((batch, 0))
        return [
            Segment(tokens=t, logprobs=logps[i, : len(t)].clone(), stop=s)
            for i, (t, s) in enumerate(zip(out_ids, stops, strict=True))
        ]

    def _stop_reason(
        self, scanner: StopScanner, token: int, turn_length: int, context_length: int, max_context: int | None
    ) -> str:
        """Why the turn ends at ``token`` ("" if it goes on), checked in :meth:`Episode.feed`'s order."""
        if scanner.feed(token):
            return scanner.stop
        if turn_length >= self.max_turn_tokens:
            return "max_turn_tokens"
        if max_context is not None and context_length >= max_context:
            return "context_limit"
        return ""

    # -- scoring -----------------------------------------------------------------------------------------

    def token_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        *,
        with_entropy: bool = False,
        score_mask: Tensor | None = None,
        model: Any = None,
        scoring: ScoringOptions | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """:func:`token_logprobs` at this policy's vocabulary and temperature, under its model and scoring
        options unless ``model`` (e.g. a frozen reference of the same architecture) or ``scoring`` is given."""
        return token_logprobs(
            self.model if model is None else model,
            input_ids,
            attention_mask,
            vocab_size=self.vocab_size,
            temperature=self.temperature,
            with_entropy=with_entropy,
            score_mask=score_mask,
            scoring=self.scoring if scoring is None else scoring,
        )


def _noise_seed(seed: int) -> int:
    """The logit noise's seed: apart from the sampling draws' (the same seed would tie the two streams)."""
    return (seed + 0x9E3779B97F4A7C15) % (1 << 63)
