"""Gymnasium environments of searchgym. Registration happens in :mod:`searchgym` (string entry points)."""

from searchgym.envs.episode import Episode, EpisodeConfig, Event, Source
from searchgym.envs.search_qa import SearchQAEnv

__all__ = ["Episode", "EpisodeConfig", "Event", "SearchQAEnv", "Source"]
