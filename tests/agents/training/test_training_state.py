"""``agents/training/state.py``: a saved optimizer and scheduler state is checked against the live ones (shapes,
types, entries) before it is restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from searchgym.errors import CheckpointError

from ..conftest import grpo_payload, linear_run

torch = pytest.importorskip("torch")

from searchgym.agents.training.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from searchgym.agents.training.state import load_training_state  # noqa: E402


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["state"][0].update(exp_avg=torch.zeros(4, 4)),
            r"state 0\['exp_avg'\] has shape \(4, 4\)",
        ),
        (lambda s: s["param_groups"][0].update(lr="0.001"), r"\['lr'\] is '0.001', expected a finite number"),
        (lambda s: s["param_groups"][0].update(betas=(0.9,)), r"\['betas'\] is \(0.9,\), expected 2 values"),
        (lambda s: s["param_groups"][0].update(amsgrad="no"), r"\['amsgrad'\] is 'no', expected a bool"),
        (lambda s: s["state"][0].update(step="x"), r"state 0\['step'\] is a str"),
        (lambda s: s["state"].update({7: {}}), "entry 7 names no parameter"),
    ],
    ids=["shape", "lr type", "betas", "amsgrad", "step", "extra entry"],
)
def test_a_mis_shaped_or_mistyped_optimizer_state_is_refused_before_training(
    tmp_path: Path, change: Any, message: str
) -> None:
    payload = grpo_payload()
    change(payload["optimizer"])
    path = save_checkpoint(tmp_path / "c.pt", payload)
    loaded = load_checkpoint(path)
    _, optimizer, scheduler = linear_run(seed=1)
    with pytest.raises(CheckpointError, match=message):
        load_training_state(optimizer, scheduler, loaded, path)


def test_a_good_optimizer_state_is_restored(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload())
    _, optimizer, scheduler = linear_run(seed=1)
    load_training_state(optimizer, scheduler, load_checkpoint(path), path)
    _, reference, _ = linear_run()
    assert torch.equal(
        optimizer.state_dict()["state"][0]["exp_avg"], reference.state_dict()["state"][0]["exp_avg"]
    )
    payload = grpo_payload()
    payload["scheduler"]["base_lrs"] = ["x"]
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(CheckpointError, match=r"scheduler\['base_lrs'\]\[0\] is 'x'"):
        load_training_state(optimizer, scheduler, load_checkpoint(path), path)
