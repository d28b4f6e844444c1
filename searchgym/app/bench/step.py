"""The time of one GRPO step at a given regime, phase by phase, and two configurations compared in one run.

``searchgym bench step`` builds a :class:`~searchgym.agents.grpo.trainer.GRPOTrainer` per configuration and
times its own step (:meth:`GRPOTrainer.train_step`): nothing here re-implements a phase. Every repetition
starts each configuration from the same weights, optimizer state and ledger (the checkpoint's) and plays the
same step (the questions and sampling seeds of step ``r + 1``), the configurations taking turns to go first,
after one untimed warm-up step each (the first step of a process pays for lazy initialisation). Probes and
evaluation run in every timed step and are charged to a step of the regime by their schedule
(``probe_every``, ``eval_every``): :func:`seconds_per_step`.

The phases: the rollout split into generation (the policy's batched turns), retrieval (the retriever's
batched searches) and env (the rest: stepping, padding, rewards); the update's ``pi_old``, reference,
forward, backward, optimizer, ledger-LLDS and displacement passes (the trainer's ``time/*`` metrics) and
what is left of it; the probes, the ledger and the greedy evaluation. :func:`update_flops` counts the model
FLOPs of the update's forward and backward from the model's shapes and the tokens scored, and
:func:`matmul_peak` measures what one large matrix product reaches on this core, per precision.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "PHASES",
    "ModelShape",
    "compare_phases",
    "matmul_peak",
    "run_step_benchmark",
    "seconds_per_step",
    "split_phases",
    "update_flops",
]

ROLLOUT = ("generation", "retrieval", "env")
UPDATE = ("pi_old", "reference", "forward", "backward", "optimizer", "ledger_llds", "displacement")
PHASES: tuple[str, ...] = (*ROLLOUT, "greedy", *UPDATE, "update_other", "probes", "ledger", "evaluation")
"""The phases of a step, in the order a step runs them (``greedy``: ``--advantage greedy``'s baseline play)."""


def split_phases(metrics: Mapping[str, float], generation_s: float, retrieval_s: float) -> dict[str, float]:
    """One step's seconds per phase of :data:`PHASES`, from its ``time/*`` metrics and the generation and
    retrieval time measured inside its rollout.

    ``env`` is the rollout's time less generation and retrieval; ``update_other`` the update's less its timed
    parts; a phase the step did not run is 0.
    """
    timed = {phase: float(metrics.get(f"time/{phase}_s", 0.0)) for phase in UPDATE}
    rollout = float(metrics["time/rollout_s"])
    return {
        "generation": generation_s,
        "retrieval": retrieval_s,
        "env": rollout - generation_s - retrieval_s,
        "greedy": float(metrics.get("time/greedy_s", 0.0)),
        **timed,
        "update_other": float(metrics["time/update_s"]) - sum(timed.values()),
        "probes": float(metrics.get("time/probe_s", 0.0)),
        "ledger": float(metrics.get("time/ledger_s", 0.0)),
        "evaluation": float(metrics.get("time/eval_s", 0.0)),
    }


def seconds_per_step(phases: Mapping[str, float], probe_every: int, eval_every: int, steps: int) -> float:
    """A step of the regime, in seconds: every phase of a step whose probes and evaluation ran, with the
    probes charged ``1 / probe_every`` and the evaluation ``1 / eval_every`` (``eval_every`` 0: one
    evaluation per run of ``steps`` steps)."""
    every = {"probes": probe_every, "evaluation": eval_every or steps}
    return sum(seconds / every.get(phase, 1) for phase, seconds in phases.items())


def compare_phases(
    base: Sequence[Mapping[str, float]], other: Sequence[Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Per phase (and ``step``, the whole): the median seconds of each configuration over its repetitions, and
    ``ratio``, the median over repetitions of other / base (paired: repetition ``r`` of each played the same
    step). A ratio is NaN where a base time is 0.

    Args:
        base: Per repetition, seconds per phase (and ``step``) of the base configuration.
        other: The same for the compared configuration, as many repetitions.
    """
    if len(base) != len(other) or not base:
        raise ValueError(f"paired repetitions needed, got {len(base)} and {len(other)}")
    out: dict[str, dict[str, float]] = {}
    for phase in base[0]:
        a = [float(rep[phase]) for rep in base]
        b = [float(rep[phase]) for rep in other]
        ratios = [y / x if x > 0 else math.nan for x, y in zip(a, b, strict=True)]
        finite = [r for r in ratios if math.isfinite(r)]
        out[phase] = {
            "base": statistics.median(a),
            "other": statistics.median(b),
            "ratio": statistics.median(finite) if len(finite) == len(ratios) else math.nan,
        }
    return out


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The shapes of a Llama/Qwen2-style decoder that set its FLOPs per token."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """From a ``transformers`` config (``hidden_size``, ``num_hidden_layers`` …)."""
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            layers=int(config.num_hidden_layers),
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            intermediate=int(config.intermediate_size),
            vocab=int(config.vocab_size),
        )

    @property
    def layer_weights(self) -> int:
        """Weights a token meets in one block: the q, k, v, o projections and the gated MLP's three."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attention + 3 * self.hidden * self.intermediate


def update_flops(shape: ModelShape, lengths: Sequence[int], scored: int, passes: int = 1) -> float:
    """Model FLOPs of the forward and backward of an update over responses of ``lengths`` real tokens with
    ``scored`` policy tokens in all, ``passes`` times (the epochs).

    A forward is ``2 x weights`` per token and block, ``4 x heads x head_dim x position`` per token and
    block for attention (causal: a token at position ``t`` attends to ``t + 1``), and ``2 x hidden x vocab``
    per scored token (the output layer runs on those only); the backward is twice the forward. Model FLOPs,
    as MFU counts them: a prefix read once for several rows is counted once per row, padding never.
    """
    attention = 4 * shape.heads * shape.head_dim
    forward = 0.0
    for n in lengths:
        forward += shape.layers * (2 * shape.layer_weights * n + attention * n * (n + 1) / 2)
    forward += 2 * shape.hidden * shape.vocab * scored
    return 3 * forward * passes


def matmul_peak(dtype: str = "float32", size: int = 1024, seconds: float = 1.0) -> float:
    """FLOP/s of one ``size`` x ``size`` matrix product in ``dtype`` on the current torch threads: the median
    of repeated products over about ``seconds``, after one untimed."""
    import torch

    kind = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(kind)
    b = torch.randn(size, size, generator=generator).to(kind)
    torch.mm(a, b)
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop or len(times) < 3:
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times)


class _Timed:
    """A callable's wall time, summed (``seconds``) while it stands in for ``fn``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class _TimedRetriever:
    """A retriever whose ``search`` calls are timed; everything else is the retriever's."""

    def __init__(self, retriever: Any) -> None:
        self._retriever = retriever
        self.search = _Timed(retriever.search)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._retriever, name)


class _Arm:
    """One configuration's trainer, instrumented, with the state every repetition starts from."""

    def __init__(self, label: str, config: Any, folder: str) -> None:
        from searchgym.agents.grpo.trainer import GRPOTrainer

        start = time.perf_counter()
        self.trainer = trainer = GRPOTrainer(
            dataclasses.replace(
                config,
                run_dir=f"{folder}/{label}",
                overwrite=True,
                resume=False,
                steps=10**9,  # never the last step: no checkpoint, no forced evaluation
                probe_every=1,
                eval_every=1 if config.eval.questions else 0,
                save_every=0,
                progress=False,
                tensorboard=False,
            )
        )
        self.setup_s = time.perf_counter() - start
        self.label = label
        self.generation = _Timed(trainer.policy.rollout_segments)
        setattr(trainer.policy, "rollout_segments", self.generation)  # noqa: B010 - times generation
        self.retriever = _TimedRetriever(trainer.env.retriever)
        setattr(trainer.env, "retriever", self.retriever)  # noqa: B010 - times retrieval
        self.sample = _Timed(trainer.sample_step)
        setattr(trainer, "sample_step", self._sample)  # noqa: B010 - keeps the step's batch
        self.batch: Any = None
        self.state = self._state()

    def _sample(self) -> Any:
        self.batch, sampling = self.sample()
        return self.batch, sampling

    def _state(self) -> dict[str, Any]:
        t = self.trainer
        state = {
            "model": t.model.state_dict(),
            "optimizer": t.optimizer.state_dict(),
            "scheduler": t.scheduler.state_dict(),
            "ledger": t.ledger.state_dict() if t.ledger is not None else None,
        }
        return copy.deepcopy(state)

    def restore(self) -> None:
        t, state = self.trainer, self.state
        t.model.load_state_dict(state["model"])
        t.optimizer.load_state_dict(state["optimizer"])
        t.scheduler.load_state_dict(state["scheduler"])
        if t.ledger is not None:
            t.ledger.load_state_dict(copy.deepcopy(state["ledger"]))

    def step(self, index: int) -> tuple[dict[str, float], dict[str, float]]:
        """Step ``index + 1`` from the saved state: its seconds per phase (and ``step``), and its metrics."""
        self.restore()
        self.trainer.step = index
        self.generation.seconds = self.retriever.search.seconds = 0.0
        metrics = self.trainer.train_step()
        phases = split_phases(metrics, self.generation.seconds, self.retriever.search.seconds)
        return phases, metrics

    def close(self) -> None:
        self.trainer.env.close()
        self.trainer.logger.close()
        self.trainer.greedy.close()


def _per_step(config: Any, phases: Mapping[str, float]) -> dict[str, float]:
    """The phases with their totals: ``rollout``, ``update`` and ``step`` (:func:`seconds_per_step`)."""
    return {
        **phases,
        "rollout": sum(phases[p] for p in ROLLOUT),
        "update": sum(phases[p] for p in (*UPDATE, "update_other")),
        "step": seconds_per_step(phases, config.probes.probe_every, config.eval.every, config.batch.steps),
    }


def _update_gflop(arm: _Arm, config: Any) -> float:
    """The model GFLOP of the update of the arm's last step (its batch, :func:`update_flops`)."""
    batch = arm.batch
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]
    shape = ModelShape.of(arm.trainer.model.config)
    return update_flops(shape, lengths, int(batch.loss_mask.sum()), config.batch.epochs) / 1e9


def _flop_rate(
    gflop: Sequence[float], reps: Sequence[Mapping[str, float]], precision: str
) -> dict[str, float]:
    """The update's GFLOP and GFLOP/s (medians over the repetitions) and this core's matrix-product peak."""
    rates = [g / (rep["forward"] + rep["backward"]) for g, rep in zip(gflop, reps, strict=True)]
    peak = matmul_peak("bfloat16" if precision == "bf16-autocast" else "float32") / 1e9
    return {
        "update_gflop": statistics.median(gflop),
        "update_gflops": statistics.median(rates),
        "peak_gflops": peak,
    }


def _logp_gap(base: _Arm, other: _Arm) -> dict[str, float]:
    """The base's last rollout batch scored at the checkpoint's weights with each configuration's scoring
    options: the largest and mean ``|Δ log π|`` over its policy tokens."""
    base.restore()
    trainer, batch = base.trainer, base.batch
    trainer.model.eval()
    a = trainer._score_all(batch)
    b = trainer._score_all(batch, other.trainer.policy.scoring)
    gap = (a - b).abs()[batch.loss_mask]
    return {
        "logp_gap_max": float(gap.max()),
        "logp_gap_mean": float(gap.mean()),
        "logp_gap_tokens": gap.numel(),
    }


def run_step_benchmark(
    config: Any,
    other: Any | None = None,
    repeats: int = 3,
    warmup: bool = True,
    flops: bool = True,
    unshared_base: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Times ``repeats`` steps of ``config`` (a ``GRPOConfig``; and of ``other``, alternating) phase by phase.

    Args:
        config: The regime (its run folder is not used: the trainers run in a temporary folder).
        other: A second configuration to compare, in the same process.
        repeats: Timed steps per configuration; figures are medians.
        warmup: One untimed step per configuration first.
        flops: Count the update's FLOPs and measure this core's matrix-product peak.
        unshared_base: The base configuration's rollout extends each of several equal contexts for itself
            (the rollout before equal contexts were read once: the same transcripts, more arithmetic).
        log: Progress lines (e.g. to stderr).

    Returns:
        ``base`` (and ``other``): ``phases`` (median seconds per phase and ``step``, a step of the regime
        with probes and evaluation charged by their schedule), ``steps_per_hour``, ``setup_s`` (building the
        trainer: loading, the on-policy probes), ``repeats`` (each repetition's phases), ``metrics`` (the
        medians of ``train/clip_frac``, ``rollout/logp_mismatch``, ``rollout/reward``, and the update's
        FLOP figures); with ``other``, ``compare`` (:func:`compare_phases`) and ``logp_gap``.
    """
    from searchgym.agents.llm.precision import resolve_precision
    from searchgym.errors import ConfigError

    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    say = log or (lambda _line: None)
    configs = {"base": config} | ({"other": other} if other is not None else {})
    with tempfile.TemporaryDirectory(prefix="searchgym-bench-step-") as folder:
        arms = {label: _Arm(label, cfg, folder) for label, cfg in configs.items()}
        arms["base"].trainer.policy._prefill.share_extensions = not unshared_base
        try:
            for label, arm in arms.items():
                say(f"{label}: trainer built in {arm.setup_s:.1f} s")
                if warmup:
                    arm.step(0)
            reps: dict[str, list[dict[str, float]]] = {label: [] for label in arms}
            kept: dict[str, list[dict[str, float]]] = {label: [] for label in arms}
            gflop: dict[str, list[float]] = {label: [] for label in arms}
            for r in range(repeats):
                order = list(arms) if r % 2 == 0 else list(reversed(arms))  # each goes first in turn
                for label in order:
                    phases, metrics = arms[label].step(r + 1)
                    reps[label].append(_per_step(configs[label], phases))
                    kept[label].append(metrics)
                    gflop[label].append(_update_gflop(arms[label], configs[label]))
                    say(f"{label} repetition {r + 1}: {reps[label][-1]['step']:.2f} s a step of the regime")
            out: dict[str, Any] = {}
            for label, arm in arms.items():
                cfg = configs[label]
                medians = {p: statistics.median(rep[p] for rep in reps[label]) for p in reps[label][0]}
                figures = {
                    key: statistics.median(m.get(key, math.nan) for m in kept[label])
                    for key in ("train/clip_frac", "rollout/logp_mismatch", "rollout/reward")
                }
                precision = resolve_precision(cfg.model.precision, cfg.run.device)
                if flops:
                    figures |= _flop_rate(gflop[label], reps[label], precision)
                out[label] = {
                    "phases": medians,
                    "steps_per_hour": 3600 / medians["step"],
                    "setup_s": arm.setup_s,
                    "precision": precision,
                    "repeats": reps[label],
                    "metrics": figures,
                }
            if other is not None:
                out["compare"] = compare_phases(reps["base"], reps["other"])
                out["logp_gap"] = _logp_gap(arms["base"], arms["other"])
        finally:
            for arm in arms.values():
                arm.close()
    return out
