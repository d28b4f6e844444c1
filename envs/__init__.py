"""Gymnasium environments of searchgym. Registration happens in :mod:`searchgym` (string entry points)."""

from searchgym.envs.episode import Episode, EpisodeSnapshot, Event
from searchgym.envs.search_qa import SearchQAEnv, searchr1_options
from searchgym.envs.spec import EnvSpec
from searchgym.envs.vector import SearchQAVectorEnv, SegmentStep
from searchgym.envs.wrappers import TurnLevelWrapper

__all__ = [
    "EnvSpec",
    "Episode",
    "EpisodeSnapshot",
    "Event",
    "SearchQAEnv",
    "SearchQAVectorEnv",
    "SegmentStep",
    "TurnLevelWrapper",
    "searchr1_options",
]
