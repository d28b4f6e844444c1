"""searchgym: Gymnasium environments where language-model agents learn to search, one token per action.

Importing the package registers the environments (by string entry point, so nothing heavy is imported):

>>> import gymnasium as gym
>>> import searchgym
>>> env = gym.make("SearchQA-v0")
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from searchgym.errors import (
    CheckpointError,
    ConfigError,
    DataFormatError,
    EpisodeFinishedError,
    InvalidActionError,
    MissingDependencyError,
    RetrieverError,
    SearchGymError,
    UnknownQuestionError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataFormatError",
    "EpisodeFinishedError",
    "InvalidActionError",
    "MissingDependencyError",
    "RetrieverError",
    "SearchGymError",
    "UnknownQuestionError",
    "__version__",
]


def _register_envs() -> None:
    # order_enforce=False: the envs refuse step() before reset() themselves, with searchgym's
    # EpisodeFinishedError, instead of Gymnasium's ResetNeeded from its OrderEnforcing wrapper.
    if "SearchQA-v0" not in registry:
        register(
            id="SearchQA-v0",
            entry_point="searchgym.envs.search_qa:SearchQAEnv",
            vector_entry_point="searchgym.envs.vector:SearchQAVectorEnv",
            order_enforce=False,
        )
    if "SearchQAMacro-v0" not in registry:
        register(
            id="SearchQAMacro-v0", entry_point="searchgym.envs.macro:SearchQAMacroEnv", order_enforce=False
        )


_register_envs()
