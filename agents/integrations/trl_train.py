"""``searchgym train trl``: the run around TRL's ``GRPOTrainer`` (run folder, metrics, resume, evaluation).

The pieces it wires together live in :mod:`searchgym.agents.integrations.trl`; this module is the command's
side of them: it prepares (or resumes) the run folder on the main process, builds the policy and the
rollout, logs TRL's metrics with searchgym's :class:`~searchgym.agents.training.metrics.MetricLogger`, gives a
resumed run its LLD-warning history back, runs the greedy evaluation and saves the model.
"""

from __future__ import annotations

import math
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

try:
    import torch
    import transformers
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError(getattr(e, "name", None) or "trl", "trl", "The TRL integration") from e

from searchgym.agents.training.metrics import MetricLogger, read_metrics
from searchgym.agents.training.policy import config_policy
from searchgym.agents.training.rollout import evaluate_greedy
from searchgym.agents.training.run import prepare_run_dir
from searchgym.errors import ConfigError
from searchgym.run_lock import lock_run_dir
from searchgym.tokenization import Tokenizer

from .config import TRLConfig
from .trl import (
    LLDSGRPOTrainer,
    LLDWarningCallback,
    SearchQARollout,
    check_trl_overrides,
    episode_reward,
    question_dataset,
    trl_args,
)
from .trl_rollout import generation_model

__all__ = ["end_processes", "last_checkpoint", "train_trl"]


_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def last_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest ``checkpoint-N`` folder TRL saved in ``run_dir`` (largest N), or ``None``."""
    found = [
        (int(m.group(1)), p)
        for p in Path(run_dir).glob("checkpoint-*")
        if p.is_dir() and (m := _CHECKPOINT.fullmatch(p.name))
    ]
    return max(found)[1] if found else None


def _prepare_run_dir(config: TRLConfig) -> Path:
    """The main process's part: refuse, replace or continue the run in ``config.run.run_dir``."""
    root = Path(config.run.run_dir)
    checkpoints = sorted(root.glob("checkpoint-*")) if root.is_dir() else []
    if checkpoints and not (config.run.resume or config.run.overwrite):
        raise ConfigError(
            f"run_dir {str(root)!r} already holds TRL checkpoints ({checkpoints[-1].name}); pass --resume to "
            "continue the run, --overwrite to replace it, or choose another --run-dir"
        )
    root = prepare_run_dir(root, resume=config.run.resume, overwrite=config.run.overwrite)
    if config.run.overwrite:
        for path in [*checkpoints, root / "init_model", root / "model"]:
            if path.is_dir():
                shutil.rmtree(path)
    return root


class _MetricsCallback(transformers.TrainerCallback):
    """Writes TRL's training logs to ``RUN_DIR/metrics.jsonl`` (and TensorBoard) with searchgym's logger.

    Only the main process writes (``logger`` is ``None`` elsewhere); every process keeps ``last``.
    """

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
            self.last.update(numbers)
            if self.logger is not None and state.is_world_process_zero:
                self.logger.log(int(state.global_step), numbers)


def _lld_history(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The ``lld/delta_adv_pos`` records of ``metrics.jsonl`` up to ``step`` (a resumed warning rule's past)."""
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    return [
        {"step": record["step"], "lld/delta_adv_pos": record["lld/delta_adv_pos"]}
        for record in read_metrics(run_dir)
        if record.get("step", 0) <= step and record.get("lld/delta_adv_pos") is not None
    ]


def _evaluate(trainer: Any, config: TRLConfig, tokenizer: Tokenizer) -> dict[str, float]:
    """Greedy evaluation on the main process (the others wait); ``{}`` elsewhere or when it cannot run."""
    from trl.distributed import DistributedBackend

    state = trainer.accelerator
    backend = DistributedBackend(state)
    if state.num_processes > 1 and (backend.is_fsdp or backend.is_zero3):
        warnings.warn(
            "skipping the final evaluation: the model is sharded over the processes; evaluate the saved "
            "model instead (searchgym eval --agent checkpoint:RUN_DIR/model)",
            RuntimeWarning,
            stacklevel=2,
        )
        return {}
    evals: dict[str, float] = {}
    with generation_model(trainer) as model:
        if state.is_main_process:
            summary = evaluate_greedy(model, tokenizer, config.env, config.eval)
            evals = {f"eval/{k}": summary[k] for k in ("em", "f1", "searches")}
        state.wait_for_everyone()
    return evals


def end_processes() -> None:
    """Wait for every process, then take down the process group that ``train_trl`` set up.

    A process that exits with a gloo group still alive can abort in its interpreter's teardown
    ("terminate called without an active exception", pytorch/pytorch#190489), failing a run that
    finished. Call it once, at the end of the program, in every process; a no-op in one process.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def train_trl(config: TRLConfig, **trl_overrides: Any) -> dict[str, float]:
    """``searchgym train trl``: GRPO (+LLDS) on SearchQA with TRL's ``GRPOTrainer``.

    Runs in one process, or in each process of ``torchrun`` / ``accelerate launch``: the run folder is
    prepared and written by the main process only (metrics gathered over the processes), the others wait.

    Args:
        config: The run's configuration.
        **trl_overrides: Fields of TRL's ``GRPOConfig`` that no option of ``config`` sets
            (``--trl-arg key=value``; see :func:`check_trl_overrides`).

    Returns:
        The last logged metrics, plus ``eval/em``, ``eval/f1``, ``eval/searches`` when
        ``config.eval.questions`` > 0 (on the main process).

    Raises:
        ConfigError: an override is refused, the batch sizes do not split over the processes, or
            ``--resume`` finds no checkpoint.
    """
    from accelerate import PartialState

    check_trl_overrides(trl_overrides)
    args = trl_args(config, **trl_overrides)  # sets up the processes (torchrun, accelerate launch)
    if args.generation_batch_size != config.batch.batch_size:
        raise ConfigError(
            f"TRL sees {args.world_size} processes but WORLD_SIZE said otherwise: its generation batch is "
            f"{args.generation_batch_size} responses, not questions_per_step * group_size = {config.batch.batch_size}"
        )
    state = PartialState()
    run_dir = Path(config.run.run_dir)
    run_lock = None
    if state.is_main_process:  # one writer per run folder: held until the run ends
        run_lock = lock_run_dir(run_dir)
        _prepare_run_dir(config)
    state.wait_for_everyone()
    checkpoint = last_checkpoint(run_dir) if config.run.resume else None
    if config.run.resume and checkpoint is None:
        raise ConfigError(
            f"--resume: no checkpoint-N folder in {str(run_dir)!r} (save them with --save-every)"
        )
    resume_step = int(checkpoint.name.split("-")[1]) if checkpoint is not None else None
    if config.run.threads is not None:
        torch.set_num_threads(config.run.threads)
    policy, _ = config_policy(config, temperature=config.loss.temperature)
    tokenizer = policy.tokenizer
    if config.loss.kl_coef > 0 and (config.model.name is None or config.model.init is not None):
        # TRL builds its reference model from model.config.name_or_path: give it the initial weights.
        init_dir = run_dir / "init_model"
        if state.is_main_process and not (config.run.resume and (init_dir / "config.json").is_file()):
            policy.model.save_pretrained(str(init_dir))
        state.wait_for_everyone()
        policy.model.config.name_or_path = str(init_dir)
    rollout = SearchQARollout(config.env, tokenizer, seed=config.run.seed)
    dataset = question_dataset(rollout.env(args.generation_batch_size // args.world_size))
    logger = None
    if state.is_main_process:
        logger = MetricLogger(run_dir, resume_step=resume_step, config=config)
    metrics_cb = _MetricsCallback(logger)
    trainer = LLDSGRPOTrainer(
        model=policy.model,
        reward_funcs=[episode_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer.to_transformers(),
        rollout_func=rollout,
        callbacks=[metrics_cb],
        llds=config.llds,
        tokenizer=tokenizer,
        warning_window=config.trl.warning_window,
    )
    if resume_step is not None:
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, LLDWarningCallback):
                callback.history = _lld_history(run_dir, resume_step)
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        results = dict(metrics_cb.last)
        if config.eval.questions > 0:
            evals = _evaluate(trainer, config, tokenizer)
            if evals and logger is not None:
                logger.log(int(trainer.state.global_step), evals)
            results.update(evals)
        if config.run.save_model:
            trainer.save_model(str(run_dir / "model"))  # every process: ZeRO-3 gathers the weights
            if state.is_main_process:
                tokenizer.to_transformers().save_pretrained(str(run_dir / "model"))
    finally:
        if logger is not None:
            logger.close()
        if run_lock is not None:
            run_lock.release()
    return {k: v for k, v in results.items() if math.isfinite(v)}
