"""Sealed checkpoints: what was saved is what loads; an edit after the save or a truncated copy is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from searchgym.agents.training.checkpoint import SEAL, load_checkpoint, payload_digest, save_checkpoint
from searchgym.errors import CheckpointError


def saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(layer.parameters())
    layer(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    payload = {
        "kind": "grpo",
        "step": 7,
        "model": layer.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": {"lr": 0.001, "seed": 3, "llds": "action"},
    }
    return save_checkpoint(tmp_path / "checkpoint.pt", payload)


def resave(path: Path, change: Any) -> None:
    """Loads the file as torch would, changes it, and saves it back with torch (the old seal kept)."""
    payload = torch.load(path, weights_only=True)
    change(payload)
    torch.save(payload, path)


def test_a_saved_checkpoint_carries_its_seal_and_loads(tmp_path: Path) -> None:
    payload = load_checkpoint(saved(tmp_path))
    assert payload[SEAL]["sha256"] == payload_digest(payload) and len(payload[SEAL]["sha256"]) == 64


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["model"]["weight"].mul_(1.0001),  # one weight nudged
        lambda p: p["model"]["bias"].__setitem__(0, 0.5),
        lambda p: p["optimizer"]["state"][0]["exp_avg"].zero_(),  # Adam's moments
        lambda p: p["config"].__setitem__("lr", 0.01),  # the config
        lambda p: p.__setitem__("step", 8),
        lambda p: p["model"].pop("bias"),  # a tensor dropped
    ],
    ids=["weight", "bias", "adam", "config", "step", "dropped"],
)
def test_an_edit_after_the_save_is_refused(tmp_path: Path, change: Any) -> None:
    path = saved(tmp_path)
    resave(path, change)
    with pytest.raises(CheckpointError, match=r"does not match its seal: a tensor or the config was changed"):
        load_checkpoint(path)


def test_parts_of_two_checkpoints_put_together_are_refused(tmp_path: Path) -> None:
    first, second = saved(tmp_path / "a"), saved(tmp_path / "b")
    other = torch.load(second, weights_only=True)
    other["model"]["weight"] += 1.0
    save_checkpoint(second, {k: v for k, v in other.items() if k not in ("format", SEAL)})
    resave(first, lambda p: p.__setitem__("model", torch.load(second, weights_only=True)["model"]))
    with pytest.raises(CheckpointError, match="does not match its seal"):
        load_checkpoint(first)


def test_a_truncated_copy_is_refused(tmp_path: Path) -> None:
    path = saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path)


def test_a_re_sealed_edit_loads_and_an_unsealed_file_is_not_checked(tmp_path: Path) -> None:
    """The seal proves the parts belong together, not who wrote them (docs/security.md says so)."""
    path = saved(tmp_path)

    def reseal(p: dict[str, Any]) -> None:
        p["config"]["lr"] = 0.01
        p[SEAL] = {"sha256": payload_digest(p)}

    resave(path, reseal)
    assert load_checkpoint(path)["config"]["lr"] == 0.01
    resave(path, lambda p: p.pop(SEAL))  # as files saved before checkpoints were sealed
    assert load_checkpoint(path)["step"] == 7


def test_a_malformed_seal_is_refused(tmp_path: Path) -> None:
    path = saved(tmp_path)
    resave(path, lambda p: p.__setitem__(SEAL, {"sha256": 3}))
    with pytest.raises(CheckpointError, match="seal is malformed"):
        load_checkpoint(path)


def test_the_digest_sees_dtype_and_shape_not_only_bytes() -> None:
    a = torch.zeros(4, dtype=torch.float32)
    assert payload_digest({"t": a}) != payload_digest({"t": a.view(torch.int32)})
    assert payload_digest({"t": a}) != payload_digest({"t": a.reshape(2, 2)})
    assert payload_digest({"t": a, SEAL: {"sha256": "x"}}) == payload_digest({"t": a})
