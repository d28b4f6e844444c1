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
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from searchgym.errors import ConfigError, MissingDependencyError

from .base import Agent, Observation

try:
    import torch
    from stable_baselines3 import A2C, DQN, PPO
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.save_util import load_from_zip_file
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


def _guess_algo(path: Path) -> str:
    """The algorithm of a saved model: ``config.json`` next to it (written by the CLI), else its own data."""
    config = path.parent / "config.json"
    if not config.is_file() and path.parent.name == "checkpoints":
        config = path.parent.parent / "config.json"
    if config.is_file():
        algo = json.loads(config.read_text(encoding="utf-8")).get("algo")
        if algo in ALGORITHMS:
            return str(algo)
    data, _, _ = load_from_zip_file(path, load_data=True, device="cpu")
    keys = set(data or {})
    # Hyperparameters that only one of the three algorithms saves.
    if "exploration_final_eps" in keys:
        return "dqn"
    if "clip_range" in keys:
        return "ppo"
    return "a2c"


def load_model(path: str | Path, algo: str | None = None) -> BaseAlgorithm:
    """Loads a saved PPO / A2C / DQN model on the CPU.

    Args:
        path: The ``.zip`` file SB3 saved.
        algo: ``"ppo"``, ``"a2c"`` or ``"dqn"``; found from the run's ``config.json`` or the file when omitted.
    """
    file = Path(path).expanduser()
    if not file.is_file() and file.with_suffix(".zip").is_file():
        file = file.with_suffix(".zip")
    if not file.is_file():
        raise ConfigError(f"no stable-baselines3 model at {str(path)!r}")
    name = algo or _guess_algo(file)
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algo {name!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name].load(file, device="cpu")


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
            model = load_model(path)
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
        return cls(env, load_model(path, kwargs.pop("algo", None)), **kwargs)

    def act(self, observation: Observation | np.ndarray, info: dict[str, Any]) -> int:
        action, _ = self.model.predict(observation, deterministic=self.deterministic)
        return int(action)
