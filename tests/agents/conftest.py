"""What the agents' tests share: one torch thread, and the GRPO configuration of a few-second run."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

GRPO_TEST_RUN: dict[str, Any] = {
    "steps": 1,
    "eval_questions": 0,
    "progress": False,
    "tensorboard": False,
    "lr": 1e-2,
}
"""What every test run of the GRPO trainer sets, whatever its sizes: one step at a learning rate that moves
a tiny model, no evaluation, no progress bar, no TensorBoard."""


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One torch thread per test (restored after): the CPUs are shared; the tiny models gain nothing from
    more. Tests of modules that never imported torch are left as they are."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def grpo_config() -> Callable[..., Any]:
    """Makes a test run's ``GRPOConfig``: ``grpo_config(folder, **values)`` runs in ``folder / "run"`` with
    :data:`GRPO_TEST_RUN`; ``values`` (a module's sizes, then a test's own) are set over it.

    A module binds its sizes once, ``functools.partial(grpo_config, **SIZES)``, as a fixture of its own.
    """
    from searchgym.agents.grpo.config import GRPOConfig

    def make(folder: Path, **values: Any) -> GRPOConfig:
        return GRPOConfig(**{"run_dir": str(folder / "run"), **GRPO_TEST_RUN, **values})

    return make
