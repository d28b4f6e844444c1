"""``searchgym conform --engine verl``: verl's agent-loop worker, advantage step and ppo_loss conform.

verl 0.9.1 pins transformers < 5.11, so these run in the verl virtualenv (``make test-verl``, which sets
``SEARCHGYM_REQUIRE_VERL=1``: a missing verl is then a failure); in the main virtualenv they are skipped.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import pytest

pytest.importorskip("torch")
if os.environ.get("SEARCHGYM_REQUIRE_VERL") != "1":
    pytest.importorskip(
        "verl", reason="verl pins transformers < 5.11: `make test-verl` runs these in .venv-verl"
    )

from searchgym.app.conform.runner import (
    CHECKS,
    Episode,
    Setup,
    TrainBatch,
    prepare,
    run_conformance,
)
from searchgym.app.conform.verl import verl_adapter


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_verl_stack_passes_every_check(loss_agg_mode: str) -> None:
    """Every check passes, and the aggregation measured on verl's ppo_loss is its loss_agg_mode."""
    results = run_conformance(functools.partial(verl_adapter, loss_agg_mode=loss_agg_mode), prepare())
    assert [r.status for r in results] == ["ok"] * len(CHECKS), [(r.name, r.detail) for r in results]
    aggregation = next(r.detail for r in results if r.name == "aggregation")
    assert aggregation.startswith(f"{loss_agg_mode}: ")


def test_verl_sequence_mean_declared_as_token_mean_fails_only_aggregation() -> None:
    """verl's real seq-mean-token-mean aggregation, declared as token-mean: the check measures verl's loss."""

    def mislabelled(episodes: Sequence[Episode], setup: Setup) -> TrainBatch:
        batch = verl_adapter(episodes, setup, loss_agg_mode="seq-mean-token-mean")
        batch.aggregation = "token-mean"
        return batch

    results = run_conformance(mislabelled, prepare())
    assert [r.name for r in results if r.status == "fail"] == ["aggregation"], [
        (r.name, r.detail) for r in results
    ]
