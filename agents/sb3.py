"""stable-baselines3 on SearchQA: a token-embedding features extractor, and agents for the evaluation harness.

Two ways in, both plain SB3:

* token view (``SearchQA-v0``): ``PPO("MultiInputPolicy", env, policy_kwargs=token_policy_kwargs())``;
  :class:`TokenFeaturesExtractor` embeds the token ids with the per-token source marker and pools them.
* macro view (``SearchQAMacro-v0``): ``PPO("MlpPolicy", env)`` on the fixed-size candidate features.

Trained models play in ``searchgym eval`` through :class:`SB3Agent`::

    searchgym eval --env SearchQAMacro-v0 --agent sb3:runs/ppo/model.zip

This module imports torch and stable-baselines3 (the ``sb3`` extra); nothing else in searchgym does.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from searchgym.errors import CheckpointError, ConfigError, MissingDependencyError

from .base import Agent, Observation

try:
    import torch
    from stable_baselines3 import A2C, DQN, PPO
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(
        e.name or "stable-baselines3", "sb3", "Using stable-baselines3 agents"
    ) from e

__all__ = [
    "ALGORITHMS",
    "MODEL_ENV_VAR",
    "SB3Agent",
    "TokenFeaturesExtractor",
    "load_model",
    "model_file",
    "recorded_env",
    "run_config_path",
    "token_policy_kwargs",
]

ALGORITHMS: dict[str, type[BaseAlgorithm]] = {"ppo": PPO, "a2c": A2C, "dqn": DQN}
"""The algorithms ``searchgym train sb3`` trains, by ``--algo`` name."""

MODEL_ENV_VAR = "SEARCHGYM_SB3_MODEL"
"""Environment variable holding the model path that ``SB3Agent(env)`` loads."""


class TokenFeaturesExtractor(BaseFeaturesExtractor):
    """Embeds the token-level observation: token + source embeddings, masked mean and the last ``k`` tokens.

    Only the first ``length`` positions are read. The mean summarises the whole context (which question,
    which passages); the last ``k`` token vectors, in order, say where in a turn the policy is.

    Args:
        observation_space: The env's ``Dict`` space with ``tokens`` ``(L,)``, ``sources`` ``(L,)`` and
            ``length`` ``(1,)``.
        embed_dim: Size of the token and source embeddings.
        last_k: Number of trailing tokens kept in order.
        features_dim: Size of the output (a linear layer with ReLU maps the pooled vectors to it).
    """

    def __init__(
        self,
        observation_space: gym.spaces.Dict,
        embed_dim: int = 32,
        last_k: int = 8,
        features_dim: int = 128,
    ) -> None:
        super().__init__(observation_space, features_dim)
        tokens, sources = observation_space["tokens"], observation_space["sources"]
        assert isinstance(tokens, gym.spaces.Box) and isinstance(sources, gym.spaces.Box)
        self.context = int(tokens.shape[0])
        self.last_k = last_k
        self.token_embedding = nn.Embedding(int(tokens.high.max()) + 1, embed_dim)
        self.source_embedding = nn.Embedding(int(sources.high.max()) + 1, embed_dim)
        self.head = nn.Sequential(nn.Linear(embed_dim * (1 + last_k) + 1, features_dim), nn.ReLU())

    def forward(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        """Maps ``tokens`` ``(B, L)``, ``sources`` ``(B, L)``, ``length`` ``(B, 1)`` to ``(B, features_dim)``."""
        # SB3 hands Box observations over as float tensors; ids are exact in float32 below 2**24.
        tokens = observations["tokens"].long()
        sources = observations["sources"].long()
        length = observations["length"].long().view(-1, 1)
        positions = torch.arange(self.context, device=tokens.device).unsqueeze(0)
        valid = (positions < length).unsqueeze(-1).float()
        vectors = (self.token_embedding(tokens) + self.source_embedding(sources)) * valid
        mean = vectors.sum(dim=1) / length.clamp(min=1).float()
        # The last k positions before `length`; positions before the start are zeroed.
        index = length - self.last_k + torch.arange(self.last_k, device=tokens.device).unsqueeze(0)
        keep = (index >= 0).unsqueeze(-1).float()
        index = index.clamp(min=0).unsqueeze(-1).expand(-1, -1, vectors.shape[-1])
        last = (vectors.gather(1, index) * keep).flatten(1)
        fill = length.float() / self.context
        return self.head(torch.cat([mean, last, fill], dim=1))


def token_policy_kwargs(embed_dim: int = 32, last_k: int = 8, features_dim: int = 128) -> dict[str, Any]:
    """``policy_kwargs`` for ``MultiInputPolicy`` on ``SearchQA-v0`` with :class:`TokenFeaturesExtractor`."""
    return {
        "features_extractor_class": TokenFeaturesExtractor,
        "features_extractor_kwargs": {"embed_dim": embed_dim, "last_k": last_k, "features_dim": features_dim},
        "net_arch": [64],
    }


# -- loading without unpickling ---------------------------------------------------------------------------------
#
# stable-baselines3's own ``load`` unpickles (cloudpickle) every ``:serialized:`` field of the zip's ``data``
# entry — the policy class, the spaces, the schedules, ``policy_kwargs`` — so a crafted zip runs code. Here
# nothing is unpickled: ``data`` is read as JSON, the policy is rebuilt from the env's spaces and the readable
# part of ``policy_kwargs`` (classes named there are looked up in an allow-list), and only the policy's weights
# (``policy.pth``) are read, with ``torch.load(weights_only=True)``. What a policy needs to act is restored;
# the training state (optimizer, schedules, buffers) is not.

#: Largest ``data`` entry read (SB3 writes a few KB).
_MAX_DATA_BYTES = 16 << 20
#: Largest ``policy.pth`` read.
_MAX_POLICY_BYTES = 4 << 30
_CLASS = re.compile(r"^<class '(?P<name>[\w.]+)'>$")


def _allowed_classes() -> dict[str, type]:
    """Classes a saved ``policy_kwargs`` may name, by ``module.qualname`` as SB3 writes them."""
    from stable_baselines3.common import torch_layers

    classes: list[type] = [
        TokenFeaturesExtractor,
        torch_layers.FlattenExtractor,
        torch_layers.CombinedExtractor,
        torch_layers.NatureCNN,
        *(
            getattr(nn, n)
            for n in ("ReLU", "Tanh", "ELU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "SELU", "Mish")
        ),
        *(getattr(torch.optim, n) for n in ("Adam", "AdamW", "RMSprop", "SGD")),
    ]
    return {f"{c.__module__}.{c.__qualname__}": c for c in classes}


def _bad_file(path: Path, message: str) -> CheckpointError:
    return CheckpointError(f"{path}: {message} (not loadable as a stable-baselines3 model)")


def _read_archive(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``data`` entry as plain JSON and the policy's state dict, nothing unpickled.

    Raises:
        CheckpointError: not a zip, missing or oversized entries, bad JSON, or weights that are not plain
            tensors.
    """
    import io
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            sizes = {info.filename: info.file_size for info in archive.infolist()}
            for name, limit in (("data", _MAX_DATA_BYTES), ("policy.pth", _MAX_POLICY_BYTES)):
                if name not in sizes:
                    raise _bad_file(path, f"the archive has no {name!r} entry")
                if sizes[name] > limit:
                    raise _bad_file(path, f"the {name!r} entry holds {sizes[name]} bytes, more than {limit}")
            raw_data = archive.read("data")
            raw_policy = archive.read("policy.pth")  # reading whole checks the CRC-32
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, OverflowError) as e:
        raise _bad_file(path, f"unreadable archive ({type(e).__name__}: {e})") from None
    try:
        data = json.loads(raw_data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: also integer-digit bombs
        raise _bad_file(path, f"the 'data' entry is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise _bad_file(path, "the 'data' entry is not a JSON object")
    try:
        buffer = io.BytesIO(raw_policy)
        state = torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only: nothing ran; any failure means a bad file
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise _bad_file(
            path, f"policy.pth holds more than plain tensors, or is damaged ({type(e).__name__}: {reason})"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise _bad_file(path, "policy.pth is not a state dict of named tensors")
    return data, state


def _readable(value: Any) -> Any:
    """A ``:serialized:`` record's readable value: a literal, or a class name."""
    if not isinstance(value, str):
        return value
    if _CLASS.match(value):
        return value
    import ast

    try:
        return ast.literal_eval(value)  # literals only: no names, calls or attributes are evaluated
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _policy_kwargs(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``policy_kwargs`` from the readable part of the saved record; classes from the allow-list."""
    saved = data.get("policy_kwargs") or {}
    if not isinstance(saved, dict):
        raise _bad_file(path, "'policy_kwargs' is not an object")
    serialized = ":serialized:" in saved
    allowed = _allowed_classes()
    kwargs: dict[str, Any] = {}
    for key, value in saved.items():
        if key.startswith(":") or key == "device":
            continue
        if serialized:
            value = _readable(value)
        if isinstance(value, str) and (match := _CLASS.match(value)):
            if match["name"] not in allowed:
                raise ConfigError(
                    f"{path}: policy_kwargs {key!r} names {match['name']}, which searchgym does not load from a "
                    "saved model (loading it would unpickle code); the classes it loads are "
                    f"{sorted(allowed)}"
                )
            value = allowed[match["name"]]
        kwargs[key] = value
    return kwargs


def run_config_path(path: str | Path) -> Path:
    """The ``config.json`` of the ``searchgym train sb3`` run a saved model belongs to: beside the model, or
    above its ``checkpoints/`` folder (it may not exist)."""
    path = Path(path)
    config = path.parent / "config.json"
    if not config.is_file() and path.parent.name == "checkpoints":
        config = path.parent.parent / "config.json"
    return config


def recorded_env(path: str | Path) -> tuple[str, dict[str, Any], Path] | None:
    """The env id and arguments the run's ``config.json`` records for the model at ``path``, and that file;
    ``None`` when the model has no run config. Checked as :func:`~searchgym.envs.recorded.make_recorded_env`
    checks them (a registered searchgym env id, its own arguments, plain data), nothing built or imported.

    Raises:
        ConfigError: the run config is unreadable or records no env id, or what it records is refused.
    """
    config = run_config_path(path)
    if not config.is_file():
        return None
    try:
        saved = json.loads(config.read_text(encoding="utf-8"))
        env_id, env_kwargs = saved["env_id"], saved.get("env", {})
    except (
        OSError,
        UnicodeDecodeError,
        ValueError,
        RecursionError,
        KeyError,
        TypeError,
        AttributeError,
    ) as e:
        raise ConfigError(
            f"{config}: not a readable train sb3 run config with an env_id ({type(e).__name__}); pass the env "
            "the model plays (eval --env, or env= in code)"
        ) from None
    from searchgym.envs.recorded import check_recorded_env

    check_recorded_env(env_id, env_kwargs, str(config))
    return env_id, env_kwargs, config


def _guess_algo(path: Path, data: dict[str, Any]) -> str:
    """The algorithm of a saved model: ``config.json`` next to it (written by the CLI), else its own data."""
    config = run_config_path(path)
    if config.is_file():
        try:
            algo = json.loads(config.read_text(encoding="utf-8")).get("algo")
        except (OSError, UnicodeDecodeError, ValueError, RecursionError, AttributeError):
            algo = None
        if algo in ALGORITHMS:
            return str(algo)
    # Hyperparameters that only one of the three algorithms saves.
    if "exploration_final_eps" in data:
        return "dqn"
    if "clip_range" in data:
        return "ppo"
    return "a2c"


def _run_env(path: Path) -> gym.Env[Any, Any]:
    """The env a ``searchgym train sb3`` run trained on, from its ``config.json``: a searchgym env id with its
    own arguments only (:func:`recorded_env`), so the file cannot make ``gym.make`` import a module."""
    recorded = recorded_env(path)
    if recorded is None:
        raise ConfigError(
            f"{path}: pass the env the model plays (load_model(path, env=...)): its spaces are not read from the "
            "file (that would unpickle them), and no run config.json is next to it"
        )
    from searchgym.envs.recorded import make_recorded_env

    env_id, env_kwargs, config = recorded
    return make_recorded_env(env_id, env_kwargs, str(config))


def _parameter_lower_bound(kwargs: dict[str, Any], env: gym.Env[Any, Any], path: Path) -> int:
    """Fewest parameters the policy ``kwargs`` describe for ``env``: the weight matrices of its MLP (and of a
    :class:`TokenFeaturesExtractor`), so a small file cannot make the loader allocate a huge network.

    Raises:
        CheckpointError: a size in ``net_arch`` or ``features_extractor_kwargs`` is not a positive integer.
    """

    def size(value: Any, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 1 << 31:
            raise _bad_file(path, f"policy_kwargs {what} holds {value!r:.40}, not a positive integer size")
        return value

    arch = kwargs.get("net_arch") or []
    chains = list(arch.values()) if isinstance(arch, dict) else [arch]
    if not all(isinstance(chain, list) for chain in chains):
        raise _bad_file(path, f"policy_kwargs net_arch is {arch!r:.60}, not a list or a dict of lists")
    space = env.observation_space
    features, extractor = 1, 0
    if kwargs.get("features_extractor_class") is TokenFeaturesExtractor and isinstance(
        space, gym.spaces.Dict
    ):
        options = kwargs.get("features_extractor_kwargs") or {}
        if not isinstance(options, dict):
            raise _bad_file(path, "policy_kwargs features_extractor_kwargs is not an object")
        embed = size(options.get("embed_dim", 32), "embed_dim")
        last_k = size(options.get("last_k", 8), "last_k")
        features = size(options.get("features_dim", 128), "features_dim")
        tokens = space["tokens"]
        vocab = int(np.max(tokens.high)) + 1 if isinstance(tokens, gym.spaces.Box) else 1
        extractor = embed * vocab + embed * (1 + last_k) * features
    elif isinstance(space, gym.spaces.Box):
        features = int(np.prod(space.shape))
    needed = extractor
    for chain in chains:
        previous = features
        for width in chain:
            needed += previous * size(width, "net_arch")
            previous = width
    return needed


#: Readable attributes of a saved space that identify it (SB3 writes them beside the pickle).
_SPACE_KEYS = (":type:", "_shape", "dtype", "n", "start", "spaces")


def _check_spaces(data: dict[str, Any], env: gym.Env[Any, Any], path: Path) -> None:
    """The env's spaces against the readable record of the model's (SB3 writes ``str`` of each attribute
    beside the pickle; compared without unpickling it).

    Raises:
        ConfigError: a space differs (another env id, view or size).
    """
    from stable_baselines3.common.save_util import data_to_json

    for what in ("observation_space", "action_space"):
        saved = data.get(what)
        if not isinstance(saved, dict):
            continue  # nothing readable recorded: the weights' shapes are still checked
        ours = json.loads(data_to_json({what: getattr(env, what)}))[what]
        differ = [k for k in _SPACE_KEYS if k in saved and k in ours and saved[k] != ours[k]]
        if differ:
            key = differ[0]
            raise ConfigError(
                f"{path}: the model's {what} differs from the env's ({key} {str(saved[key])[:120]} vs "
                f"{str(ours[key])[:120]}): evaluate on the env it was trained on (same env id, view and size "
                "arguments)"
            )


#: Buffer sizes of the rebuilt algorithm: it only predicts, so its rollout and replay buffers stay tiny.
_PREDICT_ONLY: dict[str, dict[str, Any]] = {
    "ppo": {"n_steps": 2, "batch_size": 2},
    "a2c": {"n_steps": 1},
    "dqn": {"buffer_size": 1, "learning_starts": 0},
}


def model_file(path: str | Path) -> Path:
    """The saved model ``path`` names: the file, or ``path.zip``.

    Raises:
        ConfigError: no model there (for a ``train sb3`` run folder, the message names its ``model.zip``).
    """
    file = Path(path).expanduser()
    if not file.is_file() and file.with_suffix(".zip").is_file():
        file = file.with_suffix(".zip")
    if file.is_dir() and (file / "model.zip").is_file():
        raise ConfigError(
            f"{str(path)!r} is a train sb3 run folder, not a model; did you mean {file / 'model.zip'}?"
        )
    if not file.is_file():
        raise ConfigError(f"no stable-baselines3 model at {str(path)!r}")
    return file


def load_model(
    path: str | Path, algo: str | None = None, env: gym.Env[Any, Any] | None = None
) -> BaseAlgorithm:
    """Loads a saved PPO / A2C / DQN model on the CPU, to act — without unpickling anything from the file.

    The policy is rebuilt from ``env``'s spaces (``MultiInputPolicy`` for a ``Dict`` observation space, else
    ``MlpPolicy``) and the readable part of the saved ``policy_kwargs`` (net sizes; feature extractors,
    activations and optimizers from an allow-list), its size is checked against the weights the file stores,
    and the weights (``policy.pth``) are read with ``torch.load(weights_only=True)``. Pickled fields —
    learning-rate and clip schedules, buffer classes, a custom policy class — are not read, so the model
    plays as saved but is not set up to continue training (its buffers are minimal).

    Args:
        path: The ``.zip`` file SB3 saved.
        algo: ``"ppo"``, ``"a2c"`` or ``"dqn"``; found from the run's ``config.json`` or the file when omitted.
        env: The env the model will play; default the one the run's ``config.json`` names.

    Raises:
        ConfigError: no file there, an unknown algorithm, no env and no run config, spaces that differ from
            the env's, or ``policy_kwargs`` naming a class outside the allow-list.
        CheckpointError: the file is not a readable SB3 model, or its weights do not fit the env's spaces.
    """
    file = model_file(path)
    data, state = _read_archive(file)
    name = algo or _guess_algo(file, data)
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algo {name!r}; choose one of {sorted(ALGORITHMS)}")
    if env is None:
        env = _run_env(file)
    _check_spaces(data, env, file)
    cls = ALGORITHMS[name]
    alias = "MultiInputPolicy" if isinstance(env.observation_space, gym.spaces.Dict) else "MlpPolicy"
    kwargs = _policy_kwargs(data, file)
    stored = sum(int(t.untyped_storage().nbytes()) // max(1, t.element_size()) for t in state.values())
    needed = _parameter_lower_bound(kwargs, env, file)
    if needed > stored:
        raise _bad_file(
            file,
            f"its policy_kwargs describe at least {needed:,} parameters but the file stores {stored:,} weights: a "
            "model of another env (evaluate on the env it was trained on: same env id, view and sizes), or a "
            "crafted file",
        )
    try:
        model = cls(alias, env, policy_kwargs=kwargs, device="cpu", **_PREDICT_ONLY[name])
        model.policy.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise _bad_file(
            file,
            f"its weights do not fit the policy for this env ({str(e).splitlines()[0][:300]}); evaluate on the env it "
            "was trained on (same env id, view and sizes)",
        ) from None
    rate = data.get("exploration_rate")
    if isinstance(model, DQN) and isinstance(rate, float) and 0.0 <= rate <= 1.0:
        model.exploration_rate = rate  # used by predict(deterministic=False)
    model.policy.set_training_mode(False)
    return model


class SB3Agent(Agent):
    """Plays a trained stable-baselines3 model in the evaluation harness (macro or token view).

    ``SB3Agent(env)`` (how ``searchgym eval --agent searchgym.agents.sb3:SB3Agent`` builds it) loads the model
    named by the ``SEARCHGYM_SB3_MODEL`` environment variable; in code, use :meth:`load` or pass ``model``.

    Args:
        env: The env the agent will play; its observation and action spaces must be the model's.
        model: A trained model; loaded from ``$SEARCHGYM_SB3_MODEL`` when omitted.
        deterministic: Take the most likely action instead of sampling.
    """

    name = "sb3"

    def __init__(
        self,
        env: gym.Env[Any, Any] | None = None,
        model: BaseAlgorithm | None = None,
        deterministic: bool = True,
    ) -> None:
        if model is None:
            path = os.environ.get(MODEL_ENV_VAR)
            if not path:
                raise ConfigError(f"SB3Agent needs a model: set {MODEL_ENV_VAR}=path/to/model.zip")
            model = load_model(path, env=env)
        self.model = model
        self.deterministic = deterministic
        self.name = type(model).__name__.lower()
        if env is not None:
            for what in ("observation_space", "action_space"):
                ours, theirs = getattr(model, what), getattr(env, what)
                if ours != theirs:
                    raise ConfigError(
                        f"the model's {what} {ours} differs from the env's {theirs}: evaluate on the env it was "
                        "trained on (same env id, view and size arguments)"
                    )

    @classmethod
    def load(cls, path: str | Path, env: gym.Env[Any, Any] | None = None, **kwargs: Any) -> SB3Agent:
        """An agent for the model saved at ``path`` (see :func:`load_model`)."""
        return cls(env, load_model(path, kwargs.pop("algo", None), env), **kwargs)

    def act(self, observation: Observation | np.ndarray, info: dict[str, Any]) -> int:
        action, _ = self.model.predict(observation, deterministic=self.deterministic)
        return int(action)
