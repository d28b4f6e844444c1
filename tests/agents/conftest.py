"""What the agents' tests share: one torch thread, the GRPO configuration of a few-second run, and what the
loaders' tests feed in (a GRPO checkpoint's payload, an object whose unpickling runs code)."""

from __future__ import annotations

import functools
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


def close(a: Any, b: float, tol: float = 1e-5) -> bool:
    """Whether a scalar (a float or a one-element tensor) is within ``tol`` of ``b``."""
    value = float(a.detach()) if hasattr(a, "detach") else float(a)
    return abs(value - b) < tol


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


TINY_GRPO: dict[str, Any] = {
    "max_turns": 2,
    "max_turn_tokens": 8,
    "max_context_tokens": 768,
    "questions_per_step": 2,
    "group_size": 2,
    "minibatch_size": 2,
    "probe_size": 0,
    "onpolicy_probe_size": 0,
    "ledger_size": 0,
    "kl_coef": 0.0,
    "save_every": 0,
}
"""The smallest GRPO run a knob can be seen in: 2 questions x G 2, one update a step, no probes, no ledger."""


@pytest.fixture
def tiny_grpo(grpo_config: Callable[..., Any]) -> Callable[..., Any]:
    """``tiny_grpo(folder, **values)``: a :data:`TINY_GRPO` run's config, ``values`` set over it."""
    return functools.partial(grpo_config, **TINY_GRPO)


class RunsCode:
    """Unpickling this object runs ``exec``: what a malicious checkpoint, weights file or SB3 zip would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def linear_run(seed: int = 0) -> tuple[Any, Any, Any]:
    """A model, its AdamW after one step, and a scheduler: the states a GRPO checkpoint holds."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def grpo_payload(**changes: Any) -> dict[str, Any]:
    """A GRPO checkpoint's payload of :func:`linear_run`'s states, with ``changes`` set over it."""
    model, optimizer, scheduler = linear_run()
    payload = {
        "kind": "grpo",
        "step": 1,
        "model": model.state_dict(),
        "arch": {"kind": "tiny", "layers": 1, "hidden": 4, "tokenizer": None},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "config": {"lr": 1e-3, "seed": 0, "max_turn_tokens": 48, "max_context_tokens": 1024},
    }
    payload.update(changes)
    return payload
