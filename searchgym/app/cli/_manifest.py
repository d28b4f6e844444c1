"""The run manifest of CLI commands (:mod:`searchgym.manifest`), and the check of a trained agent's data."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchgym.agents.training.config import TrainConfig

__all__ = [
    "agent_manifest",
    "env_record",
    "warn_on_data_mismatch",
    "write_config_manifest",
    "write_index_manifest",
    "write_run_manifest",
]


def env_record(env: Any) -> dict[str, Any]:
    """The record a manifest stores of a run's environment: an :class:`~searchgym.envs.EnvSpec` whole
    (:meth:`~searchgym.envs.EnvSpec.to_record`), or a mapping of its settings (``gym.make`` keyword
    arguments, the ``tokenizer`` among them) read through :meth:`~searchgym.envs.EnvSpec.from_record`, so
    every field is given and a field not given is the spec's own default."""
    from searchgym.envs import EnvSpec

    if isinstance(env, EnvSpec):
        return env.to_record()
    return {**env, **EnvSpec.from_record(env).to_record()}


def write_run_manifest(
    out: str | Path,
    command: str,
    env: Any,
    *,
    folder: bool,
    seeds: Mapping[str, Any] | None = None,
    config: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Writes the manifest of a run that wrote ``out`` (a run folder, or one file) and returns its path.
    ``env``: the run's :class:`~searchgym.envs.EnvSpec`, or its settings as a mapping (:func:`env_record`);
    ``None`` for a command without an environment."""
    from searchgym.manifest import manifest_path, run_manifest, write_manifest

    record = env_record(env) if env is not None else None
    manifest = run_manifest(command, record, seeds=seeds, config=config, extra=extra)
    return write_manifest(manifest_path(out, folder=folder), manifest)


def write_config_manifest(config: TrainConfig, command: str) -> Path:
    """Writes ``run_dir/manifest.json`` for a training entry point's config (its run folder and seed, its
    ``env`` spec, and its model's tokenizer by name). Called when the run has finished, so a
    run that was refused (its folder holds another run) leaves that run's manifest alone."""
    seeds = {"seed": config.run.seed, "world_seed": config.env.world_seed}
    tokenizer = config.model.tokenizer_name
    # A config:FILE model (random weights of an architecture) uses the built-in tokenizer unless told.
    env = {**config.env.to_dict(), "tokenizer": None if str(tokenizer).startswith("config:") else tokenizer}
    from searchgym.options import flat_values

    options = flat_values(config)  # one value per option, by the CLI's names
    return write_run_manifest(config.run.run_dir, command, env, folder=True, seeds=seeds, config=options)


def write_index_manifest(args: Any, kind: str) -> Path:
    """Writes ``OUT/manifest.json`` for an ``index`` command (``--corpus``, ``--world-seed``, ``--out``): the
    corpus it indexed, with its hash, and the hash of the index folder it wrote."""
    from searchgym.manifest import dataset_fingerprint, folder_digest

    corpus = dataset_fingerprint(None if args.corpus == "world" else args.corpus, None, args.world_seed)
    index = {"kind": kind, "out": str(Path(args.out).resolve()), "index_sha256": folder_digest(args.out)}
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    return write_run_manifest(
        args.out, f"index {kind}", None, folder=True, seeds={"world_seed": args.world_seed}, config=config,
        extra={"data": corpus, "index": index},
    )  # fmt: skip


def agent_manifest(agent: str) -> tuple[Path, dict[str, Any]] | None:
    """The manifest of the run that trained ``agent`` (``checkpoint:PATH`` or ``sb3:PATH``), when its folder
    holds one: ``manifest.json`` beside the file, or in the folder a Hugging Face export is."""
    from searchgym.manifest import MANIFEST_NAME, read_manifest

    kind, sep, path = agent.partition(":")
    if not sep or kind not in ("checkpoint", "sb3"):
        return None
    location = Path(path)
    candidate = (location if location.is_dir() else location.parent) / MANIFEST_NAME
    manifest = read_manifest(candidate)
    return (candidate, manifest) if manifest is not None else None


def warn_on_data_mismatch(agent: str, env: Any) -> str | None:
    """Prints one warning line (stderr) when ``agent``'s training manifest names another corpus or index
    than the environment ``env`` (an :class:`~searchgym.envs.EnvSpec`, or its settings as a mapping);
    returns the line, or ``None`` when there is nothing to say."""
    from searchgym.manifest import corpus_mismatch, dataset_fingerprint, retriever_fingerprint

    found = agent_manifest(agent)
    if found is None:
        return None
    path, trained = found
    from searchgym.envs import EnvSpec

    spec = env if isinstance(env, EnvSpec) else EnvSpec.from_record(env)
    current = {
        "data": dataset_fingerprint(spec.dataset, spec.split, spec.world_seed),
        "retriever": retriever_fingerprint(spec.retriever),
    }
    difference = corpus_mismatch(trained, current)
    if difference is None:
        return None
    line = f"searchgym: warning: {agent} was trained on another corpus or index than this env ({difference}; see {path})"
    print(line, file=sys.stderr)
    return line
