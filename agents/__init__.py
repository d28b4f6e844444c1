"""Agents for searchgym environments: the agent interface, scripted baselines, and the evaluation harness.

Heavy agents (the LLM policy, GRPO, stable-baselines3 adapters) live in submodules that import torch only
when used.
"""

from searchgym.agents.base import Agent, SegmentAgent
from searchgym.agents.demonstrations import (
    Demonstration,
    generate_demonstrations,
    read_demonstrations,
    write_demonstrations,
)
from searchgym.agents.evaluate import EpisodeRecord, EvalSummary, evaluate, run_episode
from searchgym.agents.heuristic import HeuristicAgent
from searchgym.agents.scripted import MacroOracleAgent, OracleAgent, RandomAgent, oracle_turns

__all__ = [
    "Agent",
    "Demonstration",
    "EpisodeRecord",
    "EvalSummary",
    "HeuristicAgent",
    "MacroOracleAgent",
    "OracleAgent",
    "RandomAgent",
    "SegmentAgent",
    "evaluate",
    "generate_demonstrations",
    "oracle_turns",
    "read_demonstrations",
    "run_episode",
    "write_demonstrations",
]
