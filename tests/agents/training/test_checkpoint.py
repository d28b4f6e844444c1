"""``agents/training/checkpoint.py``: a checkpoint holds only plain data and loads without running code; a pickled,
bit-flipped, crafted, non-finite or foreign file is a typed error; the pickled v1 format is refused with the way
to convert it; Ctrl-C during a save never leaves a torn file.

The seal is ``test_checkpoint_seal.py``'s; what a checkpoint may describe, ``test_checkpoint_checks.py``'s.
"""

from __future__ import annotations

import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchgym.errors import CheckpointError

from ..conftest import RunsCode, grpo_payload

torch = pytest.importorskip("torch")

from searchgym.agents.training.checkpoint import FORMAT, load_checkpoint, save_checkpoint, upgrade_checkpoint  # noqa: E402
from searchgym.agents.training.state import get_rng_state, set_rng_state  # noqa: E402


def small_payload() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return {
        "kind": "grpo",
        "step": 3,
        "model": model.state_dict(),
        "arch": {"kind": "tiny", "layers": 1, "hidden": 4, "tokenizer": None},  # 2 * 4**2 <= 72 weights
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": get_rng_state(torch.Generator().manual_seed(1)),
        "config": {"lr": 1e-3, "run_dir": "runs/x", "seed": 0},
    }


# -- nothing in a checkpoint runs code -------------------------------------------------------------------------


def test_checkpoint_with_a_pickled_object_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "kind": "grpo", "step": 1, "config": {"x": RunsCode(marker)}}, path)
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        load_checkpoint(path)
    assert not marker.exists()


def test_checkpoints_hold_only_plain_data_and_round_trip_the_rng(tmp_path: Path) -> None:
    payload = small_payload()
    path = save_checkpoint(tmp_path / "ckpt.pt", payload)
    torch.load(path, weights_only=True)  # loadable without trusting the file
    loaded = load_checkpoint(path)
    assert loaded["format"] == FORMAT and loaded["step"] == 3
    assert all(torch.equal(loaded["model"][k], v) for k, v in payload["model"].items())
    generator = torch.Generator()
    set_rng_state(loaded["rng"], generator)
    draws = (
        random.random(),
        float(np.random.rand()),
        float(torch.rand(1)),
        float(torch.rand(1, generator=generator)),
    )
    set_rng_state(loaded["rng"], generator)
    assert draws == (
        random.random(),
        float(np.random.rand()),
        float(torch.rand(1)),
        float(torch.rand(1, generator=generator)),
    )
    with pytest.raises(CheckpointError, match=r"payload\['rng'\]\['numpy'\]"):
        save_checkpoint(tmp_path / "bad.pt", {"rng": {"numpy": np.random.get_state()}})
    assert not (tmp_path / "bad.pt").exists()


def test_old_pickled_checkpoint_is_refused_with_the_way_to_convert_it(tmp_path: Path) -> None:
    old = tmp_path / "v1.pt"
    payload = small_payload()
    rng = dict(payload["rng"], numpy=np.random.get_state())  # v1 pickled NumPy's state with its array
    torch.save({"format": "searchgym-checkpoint-v1", **payload, "rng": rng}, old)
    with pytest.raises(CheckpointError, match=r"old searchgym checkpoint.*upgrade") as err:
        load_checkpoint(old)
    assert str(old) in str(err.value)
    upgrade_checkpoint(old, tmp_path / "v2.pt")
    converted = load_checkpoint(tmp_path / "v2.pt")
    assert converted["format"] == FORMAT and converted["step"] == 3
    set_rng_state(converted["rng"])
    assert np.random.get_state()[2] == rng["numpy"][2]
    with pytest.raises(CheckpointError, match="not a legacy"):
        upgrade_checkpoint(tmp_path / "v2.pt", tmp_path / "v3.pt")


# -- damaged, crafted and foreign files ------------------------------------------------------------------------


def test_bit_flipped_checkpoint_is_refused(tmp_path: Path) -> None:
    payload = small_payload()
    path = save_checkpoint(tmp_path / "ckpt.pt", payload)
    whole = path.read_bytes()
    weight = payload["model"]["weight"].numpy().tobytes()
    offset = whole.index(weight) + 17
    flipped = bytearray(whole)
    flipped[offset] ^= 0x04  # one bit of one weight: torch.load alone would load it silently
    path.write_bytes(bytes(flipped))
    silently = torch.load(path, weights_only=True)["model"]["weight"]
    assert not torch.equal(silently, payload["model"]["weight"])
    with pytest.raises(CheckpointError, match="CRC-32"):
        load_checkpoint(path)
    with zipfile.ZipFile(path) as archive:  # the checksums are really written
        assert all(info.CRC != 0 for info in archive.infolist() if info.file_size)


def test_a_nan_optimizer_state_is_refused_on_load(tmp_path: Path) -> None:
    payload = grpo_payload()
    payload["optimizer"]["state"][0]["exp_avg"] = torch.full((8, 8), float("nan"))
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(
        CheckpointError, match=r"optimizer\['state'\]\[0\]\['exp_avg'\] holds non-finite values"
    ):
        load_checkpoint(path)
    payload = grpo_payload()
    payload["model"]["weight"] = torch.full((8, 8), float("inf"))
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(CheckpointError, match=r"model\['weight'\] holds non-finite"):
        load_checkpoint(path)


def test_a_crafted_view_larger_than_its_storage_is_refused(tmp_path: Path) -> None:
    payload = grpo_payload()
    payload["model"]["weight"] = torch.zeros(1).expand(10**6, 10**6)
    path = tmp_path / "c.pt"
    torch.save({"format": "searchgym-checkpoint-v2", **payload}, path)
    with pytest.raises(CheckpointError, match="crafted view"):
        load_checkpoint(path)


def test_a_file_that_is_not_a_checkpoint_is_called_so_and_never_suggested_for_deletion(
    tmp_path: Path,
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    with pytest.raises(CheckpointError, match="is not a searchgym checkpoint") as err:
        load_checkpoint(readme)
    assert "delete" not in str(err.value)
    assert readme.read_text() == "# my notes\n"


# -- Ctrl-C during a save --------------------------------------------------------------------------------------


def test_ctrl_c_inside_a_checkpoint_write_arrives_once_the_checkpoint_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_sigint: Any
) -> None:
    """Ctrl-C at a write of torch.save's zip writer, which torch turns into ``RuntimeError: ... unexpected
    pos``, still ends in the one-line interruption, not a traceback and exit 1."""
    import signal

    real_save = torch.save

    def save_hit_by_ctrl_c(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        writes = 0

        class Interrupted:  # the file torch.save writes through: Ctrl-C arrives at its third write
            def write(self, data: bytes) -> int:
                nonlocal writes
                writes += 1
                if writes == 3:
                    signal.raise_signal(signal.SIGINT)
                return int(f.write(data))

            def flush(self) -> None:
                f.flush()

        real_save(obj, Interrupted(), *args, **kwargs)
        assert writes > 3

    monkeypatch.setattr(torch, "save", save_hit_by_ctrl_c)
    path = tmp_path / "checkpoint.pt"
    payload = {"step": 7, "weights": torch.ones(64)}
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, payload)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # in place, no temporary left
    loaded = torch.load(path, weights_only=True)
    assert loaded["step"] == 7 and torch.equal(loaded["weights"], payload["weights"])
