"""Agents for searchgym environments: the agent interface, scripted baselines, and the evaluation harness.

Heavy agents (the LLM policy, GRPO, stable-baselines3 adapters) live in submodules that import torch only
when used.
"""

from searchgym.agents.base import Agent, SegmentAgent
from searchgym.agents.evaluate import EpisodeRecord, EvalSummary, evaluate, run_episode
from searchgym.agents.scripted import OracleAgent, RandomAgent, oracle_turns

__all__ = [
    "Agent",
    "EpisodeRecord",
    "EvalSummary",
    "OracleAgent",
    "RandomAgent",
    "SegmentAgent",
    "evaluate",
    "oracle_turns",
    "run_episode",
]
