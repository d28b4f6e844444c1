"""A full disk loses nothing already saved: checkpoint, metrics, manifest, eval output and index writes on a
small tmpfs filled to the brim fail with one line naming the file and the space, and leave the previous
file intact and no half-written file under a final name.

The tmpfs is mounted for the test (root, or a user allowed to mount); elsewhere the tests skip.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from searchgym.agents.training.checkpoint import load_checkpoint, save_checkpoint
from searchgym.agents.training.metrics import MetricLogger, read_metrics
from searchgym.app.cli import main
from searchgym.errors import DiskFullError
from searchgym.manifest import read_manifest, write_manifest
from searchgym.retrieval import BM25Retriever

SIZE = 1 << 20  # 1 MiB


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted at ``tmp_path / 'disk'`` for the test."""
    root = tmp_path / "disk"
    root.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(root)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'mount failed'}): needs root")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fills ``disk`` with a file so that about ``leave`` bytes stay free."""
    free = shutil.disk_usage(disk).free
    with (disk / "filler").open("ab") as f:
        f.write(b"\0" * max(0, free - leave))


def final_names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def payload(scale: float) -> dict[str, Any]:
    return {"kind": "grpo", "step": 1, "model": {"w": torch.full((40_000,), scale)}, "config": {"lr": 0.1}}


def test_a_checkpoint_save_on_a_full_disk_keeps_the_previous_checkpoint(disk: Path) -> None:
    path = disk / "run" / "checkpoint.pt"
    save_checkpoint(path, payload(1.0))  # 160 KB of weights
    fill(disk, 64 * 1024)
    with pytest.raises(DiskFullError) as error:
        save_checkpoint(path, payload(2.0))
    message = str(error.value)
    assert "\n" not in message and error.value.errno == errno.ENOSPC
    assert f"no space left on the device writing {path} (it needs about 156.2 KB," in message
    assert "the previous checkpoint, intact" in message
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.full((40_000,), 1.0))
    assert final_names(path.parent) == {"checkpoint.pt"}  # no temporary file left behind


def test_the_metrics_log_on_a_full_disk_keeps_the_logged_steps(disk: Path) -> None:
    logger = MetricLogger(disk / "run", tensorboard=False)
    logger.log(1, {"reward": 0.5})
    fill(disk, 0)
    with pytest.raises(DiskFullError, match=r"writing .*metrics\.jsonl .*the steps logged before are intact"):
        for step in range(2, 10_000):  # the page cache takes a few lines before the device refuses
            logger.log(step, {"reward": 0.5, "padding": float(step)})
    with contextlib.suppress(DiskFullError):  # what is still buffered cannot be written either
        logger.close()
    (disk / "filler").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line, if the device took part of one
        records = read_metrics(disk / "run")
    assert records[0] == {"step": 1, "reward": 0.5} and len(records) >= 1


def test_a_manifest_on_a_full_disk_keeps_the_previous_one(disk: Path) -> None:
    path = disk / "manifest.json"
    write_manifest(path, {"command": "eval", "n": 1})
    fill(disk, 0)
    with pytest.raises(DiskFullError, match=rf"writing {path}\.partial .*{path} is as it was"):
        write_manifest(path, {"command": "eval", "padding": "x" * 200_000})
    assert read_manifest(path) == {"command": "eval", "n": 1}


def test_eval_out_on_a_full_disk_is_one_line_and_keeps_the_earlier_file(
    disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = disk / "e.jsonl"
    out.write_text('{"earlier": true}\n')
    fill(disk, 8 * 1024)
    assert (
        main(["eval", "--agent", "heuristic", "--episodes", "200", "--no-progress", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"searchgym: error: no space left on the device writing {out}.partial"
    )
    assert out.read_text() == '{"earlier": true}\n'


def test_a_bm25_index_save_on_a_full_disk_keeps_the_previous_index(disk: Path, world: Any) -> None:
    retriever = BM25Retriever(world.passages)
    folder = disk / "index"
    retriever.save(folder)
    before = {name: (folder / name).read_bytes() for name in final_names(folder)}
    (folder / "bm25.npz").rename(disk / "aside.npz")  # room for one more index, not two
    fill(disk, 16 * 1024)
    (disk / "aside.npz").rename(folder / "bm25.npz")
    with pytest.raises(
        DiskFullError, match=rf"writing {folder}/bm25\.npz \(it needs about .*are as they were"
    ):
        retriever.save(folder)
    assert {name: (folder / name).read_bytes() for name in final_names(folder)} == before
    assert BM25Retriever.load(folder, world.passages).search(["guild"], 2) == retriever.search(["guild"], 2)


def test_other_os_errors_pass_through(tmp_path: Path) -> None:
    from searchgym.integrity import disk_full_is_clear

    with pytest.raises(PermissionError), disk_full_is_clear(tmp_path / "x"):
        raise PermissionError(errno.EACCES, "denied")
    message = r"\(.* free\): free some space or write elsewhere$"
    with pytest.raises(DiskFullError, match=message), disk_full_is_clear(tmp_path / "x"):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    with pytest.raises(DiskFullError, match=message), disk_full_is_clear(tmp_path / "x"):
        try:  # how torch.save's zip writer reports it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 960 vs 854")  # noqa: B904
