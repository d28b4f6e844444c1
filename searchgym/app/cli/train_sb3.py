"""``searchgym train sb3``: train PPO, A2C or DQN (stable-baselines3) on the macro or the token view.

A run directory holds ``config.json`` (everything needed to rebuild the env and reload the model),
``progress.csv`` (SB3's logger), ``checkpoints/`` (SB3's ``CheckpointCallback``), ``model.zip``, and, after
the closing evaluation, ``eval.json`` and ``eval.jsonl`` (transcripts). The model then plays in
``searchgym eval --agent sb3:<run>/model.zip``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchgym.app.cli._common import add_env_arguments, env_spec_from_args, format_table
from searchgym.app.cli._manifest import write_run_manifest
from searchgym.errors import ConfigError

if TYPE_CHECKING:
    from searchgym.envs.spec import EnvSpec

COMMAND = ("train", "sb3")
HELP = "train a stable-baselines3 agent (PPO, A2C, DQN) on the macro-action or the token-level view"

VIEWS = {"macro": "SearchQAMacro-v0", "token": "SearchQA-v0"}
"""The env id of each ``--view``."""

HYPERPARAMS: dict[tuple[str, str], dict[str, Any]] = {
    # Macro episodes are 2-4 steps with the reward at the end; small nets and short rollouts suffice.
    ("ppo", "macro"): {"n_steps": 128, "batch_size": 128, "n_epochs": 10, "learning_rate": 3e-4, "ent_coef": 0.01},
    ("a2c", "macro"): {"n_steps": 8, "learning_rate": 7e-4, "ent_coef": 0.01},
    ("dqn", "macro"): {"learning_starts": 1000, "buffer_size": 50_000, "exploration_fraction": 0.3,
                       "train_freq": 4, "target_update_interval": 500, "learning_rate": 5e-4},
    # Token episodes are ~100 steps over an 8192-way action; these only keep runs short.
    ("ppo", "token"): {"n_steps": 128, "batch_size": 64, "n_epochs": 4, "learning_rate": 3e-4},
    ("a2c", "token"): {"n_steps": 16, "learning_rate": 7e-4},
    ("dqn", "token"): {"learning_starts": 200, "buffer_size": 5_000, "train_freq": 4,
                       "target_update_interval": 500, "learning_rate": 5e-4},
}  # fmt: skip
"""Default SB3 keyword arguments per ``(algo, view)``; ``--lr`` overrides the rate."""


def _env_spec(**record: Any) -> EnvSpec:
    """The spec of a record (:meth:`~searchgym.envs.EnvSpec.from_record`), imported when first needed."""
    from searchgym.envs.spec import EnvSpec

    return EnvSpec.from_record(record)


@dataclass(frozen=True)
class SB3TrainConfig:
    """One SB3 training run (the CLI's options, validated once).

    Attributes:
        algo: ``"ppo"``, ``"a2c"`` or ``"dqn"``.
        view: ``"macro"`` (``SearchQAMacro-v0``, ``MlpPolicy``) or ``"token"`` (``SearchQA-v0``,
            ``MultiInputPolicy`` with the token features extractor).
        steps: Environment steps to train for (macro: turns; token: tokens).
        seed: Seed of the model and of the training envs.
        run_dir: Run directory.
        n_envs: Training envs stepped together (``DummyVecEnv``).
        lr: Overrides the default rate of ``HYPERPARAMS``.
        save_every: Save a checkpoint every this many steps (0: none).
        eval_questions: Questions of the closing evaluation (0: none).
        eval_split: Split of the closing evaluation.
        threads: torch CPU threads.
        env: The training env's spec (the split included).
        tokenizer: The env's tokenizer by name (default: the built-in one).
        report_to: Where SB3's logged figures go besides ``progress.csv``
            (:mod:`~searchgym.agents.training.reporting`).
    """

    algo: str
    view: str = "macro"
    steps: int = 20_000
    seed: int = 0
    run_dir: str = "runs/sb3"
    n_envs: int = 4
    lr: float | None = None
    save_every: int = 5_000
    eval_questions: int = 200
    eval_split: str = "test"
    threads: int = 1
    env: EnvSpec = field(default_factory=lambda: _env_spec())
    report_to: str = "tensorboard"
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.algo not in ("ppo", "a2c", "dqn"):
            raise ConfigError(f"algo must be one of ['a2c', 'dqn', 'ppo'], got {self.algo!r}")
        if self.view not in VIEWS:
            raise ConfigError(f"view must be one of {sorted(VIEWS)}, got {self.view!r}")
        for name in ("steps", "n_envs", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.save_every < 0 or self.eval_questions < 0:
            raise ConfigError("save_every and eval_questions must be >= 0")
        from searchgym.agents.training.reporting import check_report_to

        check_report_to(self.report_to)

    @property
    def env_record(self) -> dict[str, Any]:
        """The training env as ``config.json`` records it: the spec's record
        (:meth:`~searchgym.envs.EnvSpec.to_record`), and the tokenizer where one is named; what
        :func:`searchgym.agents.sb3.recorded_env` reads back as ``gym.make`` keyword arguments."""
        tokenizer = {"tokenizer": self.tokenizer} if self.tokenizer is not None else {}
        return {**self.env.to_record(), **tokenizer}

    @property
    def env_id(self) -> str:
        return VIEWS[self.view]

    @property
    def policy(self) -> str:
        return "MlpPolicy" if self.view == "macro" else "MultiInputPolicy"

    @property
    def log_interval(self) -> int:
        """SB3's ``log_interval`` for about one ``progress.csv`` row per 1,000 steps.

        On-policy algorithms count rollouts (``n_steps * n_envs`` steps each); DQN counts episodes.
        """
        if self.algo == "dqn":
            return 300 if self.view == "macro" else 10  # macro episodes take ~3 steps, token ones ~100
        return max(1, 1000 // (int(self.model_kwargs["n_steps"]) * self.n_envs))

    @property
    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the SB3 algorithm (policy network included, not the env)."""
        kwargs = dict(HYPERPARAMS[(self.algo, self.view)])
        if self.lr is not None:
            kwargs["learning_rate"] = self.lr
        return kwargs


DEPRECATED_FLAGS = {
    "--timesteps": "--steps",
    "--out": "--run-dir",
    "--learning-rate": "--lr",
    "--checkpoint-freq": "--save-every",
    "--eval-episodes": "--eval-questions",
}
"""Flags that still set their option, with a line on stderr naming the one the other trainers share."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.agents.training.reporting import REPORT_TO, REPORT_TO_HELP
    from searchgym.app.cli._options import Deprecated

    parser.add_argument("--algo", required=True, choices=["ppo", "a2c", "dqn"], help="SB3 algorithm")
    parser.add_argument(
        "--view",
        default="macro",
        choices=sorted(VIEWS),
        help="macro: SearchQAMacro-v0 (choose a query / an answer); token: SearchQA-v0",
    )
    parser.add_argument("--steps", type=int, default=20_000, help="environment steps to train for")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the envs")
    parser.add_argument("--run-dir", default=None, help="run directory (default: runs/sb3-ALGO-VIEW-sSEED)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run an existing --run-dir holds (refused otherwise)",
    )
    parser.add_argument("--n-envs", type=int, default=4, help="training envs stepped together")
    parser.add_argument(
        "--lr", type=float, default=None, help="learning rate (default: HYPERPARAMS' per algo)"
    )
    parser.add_argument("--save-every", type=int, default=5_000, help="checkpoint every N steps (0: off)")
    parser.add_argument(
        "--eval-questions", type=int, default=200, help="questions of the closing evaluation (0: off)"
    )
    parser.add_argument("--eval-split", default="test", help="split of the closing evaluation")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--report-to", choices=REPORT_TO, default="tensorboard", help=REPORT_TO_HELP)
    types: dict[str, Any] = {"--out": str, "--learning-rate": float}  # the others count: int
    for old, new in DEPRECATED_FLAGS.items():
        parser.add_argument(
            old,
            dest=new[2:].replace("-", "_"),
            action=Deprecated,
            new=new,
            help=argparse.SUPPRESS,
            type=types.get(old, int),
        )
    add_env_arguments(
        parser
    )  # --max-context-tokens / --max-turn-tokens default to 384 / 24 for the token view
    # The view chooses the env id; training reads the train split.
    parser.set_defaults(env=None, split="train")


def config_from_args(args: argparse.Namespace) -> SB3TrainConfig:
    """The validated run config of parsed CLI options."""
    if args.env is not None and args.env != VIEWS[args.view]:
        raise ConfigError(
            f"--env {args.env!r} does not match --view {args.view} ({VIEWS[args.view]}); omit --env"
        )
    env = {k: v for k, v in env_spec_from_args(args).to_record().items() if v is not None}
    # The token view trains on short transcripts unless told otherwise (the record holds explicit sizes).
    token_sizes = {"max_context_tokens": 384, "max_turn_tokens": 24} if args.view == "token" else {}
    return SB3TrainConfig(
        algo=args.algo, view=args.view, steps=args.steps, seed=args.seed,
        run_dir=args.run_dir or f"runs/sb3-{args.algo}-{args.view}-s{args.seed}", n_envs=args.n_envs,
        lr=args.lr, save_every=args.save_every,
        eval_questions=args.eval_questions, eval_split=args.eval_split, threads=args.threads,
        env=_env_spec(**{**token_sizes, **env}), report_to=args.report_to,
        tokenizer=getattr(args, "tokenizer", None),
    )  # fmt: skip


def train(config: SB3TrainConfig) -> dict[str, Any]:
    """Trains, saves and evaluates one model; returns the evaluation figures (empty without evaluation)."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import KVWriter, configure

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.agents import evaluate
    from searchgym.agents.sb3 import ALGORITHMS, SB3Agent, token_policy_kwargs
    from searchgym.agents.training.reporting import open_reporters

    class EpisodeMetrics(BaseCallback):
        """Logs the episode figures of the env's final ``info`` (``rollout/em``, ``rollout/searches``, ...)."""

        def _on_step(self) -> bool:
            for info, done in zip(self.locals["infos"], self.locals["dones"], strict=True):
                if done and "em" in info:
                    for key in ("em", "f1", "searches", "invalid_turns"):
                        self.logger.record_mean(f"rollout/{key}", float(info[key]))
            return True

    class Reported(KVWriter):
        """Hands each row of SB3's logger to the ``--report-to`` reporters (the numbers SB3 would give its
        own TensorBoard writer)."""

        def __init__(self, reporters: list[Any]) -> None:
            self.reporters = reporters

        def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
            scalars = {
                k: float(v)
                for k, v in key_values.items()
                if isinstance(v, int | float) and "tensorboard" not in (key_excluded.get(k) or ())
            }
            for reporter in self.reporters:
                reporter.log(step, scalars)

        def close(self) -> None:
            for reporter in self.reporters:
                reporter.close()

    torch.set_num_threads(config.threads)
    out = Path(config.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps({**asdict(config), "env": config.env_record, "env_id": config.env_id, "policy": config.policy,
                    "model_kwargs": config.model_kwargs}, indent=2) + "\n", encoding="utf-8"
    )  # fmt: skip
    # render_mode=None: make_vec_env otherwise asks for "rgb_array", which SearchQA envs reject.
    venv = make_vec_env(config.env_id, n_envs=config.n_envs, seed=config.seed,
                        env_kwargs={**config.env_record, "render_mode": None})  # fmt: skip
    kwargs = config.model_kwargs
    kwargs["policy_kwargs"] = token_policy_kwargs() if config.view == "token" else {"net_arch": [128, 128]}
    model = ALGORITHMS[config.algo](config.policy, venv, seed=config.seed, device="cpu", **kwargs)
    logger = configure(str(out), ["stdout", "csv"])
    record = {**asdict(config), "env": config.env_record}  # as config.json holds it
    logger.output_formats.append(Reported(open_reporters(config.report_to, out, config=record)))
    model.set_logger(logger)
    callbacks: list[BaseCallback] = [EpisodeMetrics()]
    if config.save_every:
        # CheckpointCallback counts calls (one per vector step), not env steps.
        every = max(1, config.save_every // config.n_envs)
        callbacks.append(CheckpointCallback(every, str(out / "checkpoints"), name_prefix=config.algo))
    start = time.perf_counter()
    model.learn(config.steps, callback=CallbackList(callbacks), log_interval=config.log_interval)
    seconds = time.perf_counter() - start
    model.logger.record("time/train_seconds", seconds)
    model.logger.dump(model.num_timesteps)  # a last row, even when the run was shorter than log_interval
    model.save(out / "model.zip")
    logger.close()
    venv.close()
    if not config.eval_questions:
        return {}
    env = gym.make(config.env_id, **{**config.env_record, "split": config.eval_split})
    summary = evaluate(env, SB3Agent(env, model), config.eval_questions, seed=config.seed,
                       out=out / "eval.jsonl")  # fmt: skip
    metrics = {"algo": config.algo, "view": config.view, "seed": config.seed, "split": config.eval_split,
               "steps": model.num_timesteps, "train_seconds": round(seconds, 1), **summary.metrics()}  # fmt: skip
    (out / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


RUN_FILES = (
    "config.json",
    "model.zip",
    "progress.csv",
    "checkpoints",
    "eval.json",
    "eval.jsonl",
    "manifest.json",
    "tb",
)
"""What a ``train sb3`` run writes into its folder (an earlier run is recognised by any of them)."""


def prepare_out(out: str | Path, overwrite: bool) -> None:
    """Refuses a ``--run-dir`` that holds an earlier run unless ``overwrite``; with it, removes that run's files
    (so old ``checkpoints/`` never mix with the new run's).

    Raises:
        ConfigError: ``out`` is a file, or holds a run and ``overwrite`` is not set.
    """
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--run-dir {str(root)!r} is a file, not a run folder")
    existing = [name for name in RUN_FILES if (root / name).exists()]
    if not existing:
        return
    if not overwrite:
        raise ConfigError(
            f"--run-dir {str(root)!r} already holds a run ({', '.join(existing)}); pass --overwrite to replace "
            "it, or choose another --run-dir"
        )
    for name in existing:
        target = root / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    prepare_out(config.run_dir, args.overwrite)
    metrics = train(config)
    write_run_manifest(
        config.run_dir,
        "train sb3",
        config.env_record,
        folder=True,
        seeds={"seed": config.seed},
        config=config,
    )
    if metrics:
        print(format_table([metrics], ["algo", "view", "seed", "split", "em", "f1", "searches", "valid_format",
                                       "episodes", "train_seconds"]))  # fmt: skip
    return 0
