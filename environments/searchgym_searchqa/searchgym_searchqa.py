"""The verifiers id ``searchgym-searchqa``: searchgym's SearchQA taskset, env and harness (docs/verifiers.md)."""

from searchgym.app.hub.verifiers_env import (
    SearchQAEnv,
    SearchQAHarness,
    SearchQATaskset,
    load_environment,
)

__all__ = ["SearchQAEnv", "SearchQAHarness", "SearchQATaskset", "load_environment"]
