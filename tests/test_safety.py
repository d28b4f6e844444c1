"""Nothing loaded from a file runs code, crafted files give typed errors, no results are lost.

The random mutations are in ``test_fuzz_files.py``; attacks on the other inputs in ``test_trust.py``.
"""

from __future__ import annotations

import json
import random
import re
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchgym.cli import main
from searchgym.data import Passage, load_dataset, load_flashrag, load_searchr1
from searchgym.errors import CheckpointError, ConfigError, DataFormatError
from searchgym.retrieval import BM25Retriever

torch = pytest.importorskip("torch")

from searchgym.agents.grpo.checkpoint import FORMAT, load_checkpoint, save_checkpoint, upgrade_checkpoint  # noqa: E402
from searchgym.agents.grpo.runtime import (  # noqa: E402
    MetricLogger,
    check_resume_config,
    prepare_run_dir,
    read_metrics,
)
from searchgym.agents.grpo.training_state import get_rng_state, set_rng_state  # noqa: E402
from searchgym.integrity import remove_stale_temp_files  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class _RunsCode:
    """Unpickling this object runs ``exec``: what a malicious checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


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


# -- 1. checkpoints never run code -------------------------------------------------------------------------------------


def test_checkpoint_with_a_pickled_object_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "kind": "grpo", "step": 1, "config": {"x": _RunsCode(marker)}}, path)
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


def test_upgrade_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from searchgym.cli import main

    old = tmp_path / "v1.pt"
    torch.save(
        {
            "format": "searchgym-checkpoint-v1",
            "kind": "sft",
            "step": 1,
            "rng": {"numpy": np.random.get_state()},
        },
        old,
    )
    assert main(["checkpoint", "upgrade", str(old), str(tmp_path / "new.pt")]) == 0
    assert load_checkpoint(tmp_path / "new.pt")["kind"] == "sft"
    assert f"wrote {tmp_path / 'new.pt'}" in capsys.readouterr().out
    assert main(["checkpoint", "upgrade", str(tmp_path / "new.pt"), str(tmp_path / "v3.pt")]) == 2
    assert "not a legacy searchgym checkpoint" in capsys.readouterr().err


def test_a_crafted_architecture_is_refused_before_building_a_model(tmp_path: Path) -> None:
    from searchgym.agents.grpo.config import SFTConfig
    from searchgym.agents.grpo.runtime import build_policy

    path = save_checkpoint(
        tmp_path / "c.pt",
        {
            "kind": "sft",
            "step": 0,
            "model": {},
            "arch": {"kind": "tiny", "layers": 10**9, "hidden": 8, "tokenizer": None},
        },
    )
    with pytest.raises(CheckpointError, match="'layers'"):
        build_policy(SFTConfig(init=str(path)))


# -- 2 and 10. BM25 index files ----------------------------------------------------------------------------------------


def saved_index(tmp_path: Path) -> tuple[Path, list[Passage]]:
    passages = [Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3}") for i in range(30)]
    folder = BM25Retriever(passages).save(tmp_path / "index")
    return folder, passages


def rewrite_arrays(folder: Path, **arrays: np.ndarray) -> None:
    """Rewrites arrays as an attacker would: the manifest re-sealed, so the checks behind the hash run."""
    with np.load(folder / "bm25.npz") as f:
        current = {k: f[k] for k in f.files}
    np.savez(folder / "bm25.npz", **{**current, **arrays})
    reseal(folder)


def reseal(folder: Path, **changes: Any) -> None:
    """``bm25.json`` with ``changes`` and fresh hashes (what a crafted index carries)."""
    from searchgym.integrity import seal

    meta = json.loads((folder / "bm25.json").read_text())
    (folder / "bm25.json").write_text(
        json.dumps(seal({**meta, **changes}, {"bm25.npz": folder / "bm25.npz"}))
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda a: {
                "indices": np.where(a["indices"] == 0, 10**6, a["indices"]).astype(a["indices"].dtype)
            },
            "outside",
        ),
        (lambda a: {"indices": -a["indices"] - 1}, "outside"),
        (lambda a: {"indptr": a["indptr"][::-1].copy()}, "indptr"),
        (lambda a: {"indptr": a["indptr"][:-1]}, "indptr"),
        (lambda a: {"indices": a["indices"][::-1].copy()}, "not sorted"),
        (lambda a: {"data": a["data"].astype(np.float32)}, "float64"),
        (lambda a: {"indices": a["indices"].astype(np.float64)}, "int32 or int64"),
        (lambda a: {"data": a["data"].reshape(1, -1)}, "1-D"),
        (lambda a: {"data": a["data"][:-1]}, "weights for"),
        (lambda a: {"data": np.full_like(a["data"], np.nan)}, "not finite"),
        (lambda a: {"data": np.array([object()], dtype=object)}, "float64"),
    ],
    ids=[
        "index too large",
        "negative index",
        "indptr decreasing",
        "indptr short",
        "unsorted",
        "data dtype",
        "indices dtype",
        "2-D",
        "short data",
        "nan",
        "object",
    ],
)
def test_crafted_bm25_arrays_are_refused(tmp_path: Path, change: Any, message: str) -> None:
    folder, passages = saved_index(tmp_path)
    with np.load(folder / "bm25.npz") as f:
        arrays = {k: f[k] for k in f.files}
    rewrite_arrays(folder, **change(arrays))
    with pytest.raises(DataFormatError, match=message) as err:
        BM25Retriever.load(folder, passages)
    assert "bm25.npz" in str(err.value)


def test_truncated_or_bit_flipped_bm25_index_is_a_typed_error(tmp_path: Path) -> None:
    folder, passages = saved_index(tmp_path)
    npz = folder / "bm25.npz"
    whole = npz.read_bytes()
    weights = BM25Retriever.load(folder, passages).weights.data.tobytes()
    npz.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataFormatError, match=r"bm25\.npz"):
        BM25Retriever.load(folder, passages)
    flipped = bytearray(whole)
    flipped[whole.index(weights) + 5] ^= 1  # one bit of one weight
    npz.write_bytes(bytes(flipped))
    with pytest.raises(DataFormatError, match=r"bm25\.npz"):
        BM25Retriever.load(folder, passages)
    npz.write_bytes(whole)
    meta = json.loads((folder / "bm25.json").read_text())
    reseal(folder, shape=[meta["shape"][0] + 1, meta["shape"][1]])
    with pytest.raises(DataFormatError, match="shape"):
        BM25Retriever.load(folder, passages)


def test_a_crafted_index_cannot_crash_the_process(tmp_path: Path) -> None:
    """Today's segfault, reproduced in a child process: it must end with a typed error instead."""
    import subprocess

    folder, passages = saved_index(tmp_path)
    with np.load(folder / "bm25.npz") as f:
        indices = f["indices"].copy()
    indices[:] = 2**31 - 1
    rewrite_arrays(folder, indices=indices)
    script = (
        "from searchgym.data import Passage\nfrom searchgym.retrieval import BM25Retriever\n"
        "from searchgym.errors import DataFormatError\n"
        f"p = [Passage(str(i), f'title {{i}}', f'alpha beta gamma {{i}} delta {{i % 3}}') for i in range(30)]\n"
        f"try:\n    r = BM25Retriever.load({str(folder)!r}, p)\n    print(r.search(['alpha beta'] * 50, 3))\n"
        "except DataFormatError:\n    print('typed error')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "typed error" in proc.stdout, proc.stderr[-2000:]


# -- 3. nothing that executes ------------------------------------------------------------------------------------------


def test_no_loader_can_execute_code_from_a_file() -> None:
    """Every place that deserialises: no pickle, no eval, no trusted torch.load outside the explicit upgrade."""
    patterns = {
        "weights_only=False": re.compile(r"weights_only\s*=\s*False"),
        "allow_pickle=True": re.compile(r"allow_pickle\s*=\s*True"),
        "pickle.load": re.compile(r"\bpickle\.loads?\("),
        "eval/exec": re.compile(r"(?<![.\w])(eval|exec)\("),
        "yaml.load": re.compile(r"yaml\.(unsafe_)?load\("),
        "trust_remote_code=True": re.compile(r"trust_remote_code\s*=\s*True"),
        "torch.load without weights_only": re.compile(r"torch\.load\((?![^)]*weights_only)"),
    }
    allowed = {("agents/grpo/checkpoint.py", "weights_only=False")}  # upgrade_checkpoint, explicit opt-in
    found = []
    for folder in ("searchgym", "envs", "agents"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            code = "\n".join(line.split("#")[0] for line in path.read_text(encoding="utf-8").splitlines())
            code = re.sub(r'""".*?"""', "", code, flags=re.S)  # docstrings may name what is forbidden
            for name, pattern in patterns.items():
                hits = len(pattern.findall(code))
                if hits and (rel, name) not in allowed:
                    found.append((rel, name))
                if (rel, name) in allowed:
                    assert hits == 1, f"{rel}: {name} must stay confined to upgrade_checkpoint"
    assert not found


# -- 4. --out never loses an earlier file ------------------------------------------------------------------------------


def test_failed_eval_keeps_the_earlier_out_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "crashing_agent.py").write_text(
        "from searchgym.agents.base import Agent\n"
        "class Crash(Agent):\n"
        "    def __init__(self, env): pass\n"
        "    def act(self, observation, info):\n"
        "        raise RuntimeError('agent bug')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "results.jsonl"
    earlier = "".join(json.dumps({"episode": i}) + "\n" for i in range(2932))
    out.write_text(earlier)
    with pytest.raises(RuntimeError, match="agent bug"):
        main(
            ["eval", "--agent", "crashing_agent:Crash", "--episodes", "3", "--no-progress", "--out", str(out)]
        )
    assert out.read_text() == earlier
    assert (
        main(["eval", "--agent", "oracle", "--episodes", "3", "--no-progress", "--json", "--out", str(out)])
        == 0
    )
    assert len(out.read_text().splitlines()) == 3 and not Path(f"{out}.partial").exists()


def test_failed_demos_keep_the_earlier_out_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from searchgym.agents import scripted

    out = tmp_path / "demos.jsonl"
    out.write_text('{"kept": true}\n')

    def crash(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("oracle bug")

    monkeypatch.setattr(scripted.OracleAgent, "act", crash)
    with pytest.raises(RuntimeError, match="oracle bug"):
        main(["demos", "--episodes", "2", "--out", str(out)])
    assert out.read_text() == '{"kept": true}\n'


# -- 5 and 9. run folders ----------------------------------------------------------------------------------------------


def fake_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(b"weights")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / "notes.txt").write_text("mine")


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_training_refuses_to_overwrite_a_run(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    fake_run(run)
    assert main(["train", command, "--run-dir", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert (run / "checkpoint.pt").read_bytes() == b"weights"
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_overwrite_replaces_only_the_run_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    fake_run(run)
    (run / "tb").mkdir()
    with pytest.raises(ConfigError, match="choose one"):
        prepare_run_dir(run, resume=True, overwrite=True)
    prepare_run_dir(run, resume=False, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    prepare_run_dir(run, resume=False)  # nothing of a run left: a new run may start
    prepare_run_dir(tmp_path / "new" / "run", resume=False)
    assert (tmp_path / "new" / "run").is_dir()


@pytest.mark.slow
def test_stale_checkpoint_temp_files_are_removed_on_the_next_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    run = tmp_path / "run"
    run.mkdir()
    dead = run / ".checkpoint.pt.999999999.0a1b2c3d.tmp"  # no such process: a save killed mid-write
    live = run / f".checkpoint.pt.{os.getppid()}.0a1b2c3d.tmp"  # a process that is running: kept
    dead.write_bytes(b"half a checkpoint")
    live.write_bytes(b"being written")
    assert remove_stale_temp_files(run) == [dead]
    assert live.exists()
    dead.write_bytes(b"half a checkpoint")
    assert (
        main(["train", "grpo", "--run-dir", str(run), "--resume", "--no-progress"]) == 2
    )  # no checkpoint yet
    assert not dead.exists() and live.exists()


# -- 6. torn metrics lines ---------------------------------------------------------------------------------------------


def test_torn_last_metrics_line_is_dropped_on_resume(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x"')
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3: torn last line"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    with pytest.warns(UserWarning, match="torn last line"):
        logger = MetricLogger(tmp_path, resume_step=2, tensorboard=False)
    logger.log(3, {"x": 3.0})
    logger.close()
    assert [r["step"] for r in read_metrics(log)] == [1, 2, 3]


def test_corrupt_metrics_line_before_the_last_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(DataFormatError, match=r"metrics\.jsonl:2: corrupt metrics record") as err:
        MetricLogger(tmp_path, resume_step=3, tensorboard=False)
    assert err.value.line == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log.write_text('{"step": 1}\n{"step": 2}\n')
        assert len(read_metrics(log)) == 2


# -- 7. corrupt checkpoints --------------------------------------------------------------------------------------------


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


# -- 8. options changed on resume --------------------------------------------------------------------------------------


def test_changed_options_on_resume_are_refused_or_applied_and_reported() -> None:
    saved = {"lr": 3e-4, "seed": 0, "steps": 10, "eval_every": 0, "resume": False, "run_dir": "r"}
    with pytest.raises(ConfigError, match=r"--lr: saved 0.0003, now 0.1.*--seed: saved 0, now 1"):
        check_resume_config(saved, {**saved, "lr": 0.1, "seed": 1, "resume": True})
    with pytest.warns(UserWarning, match=r"steps: 10 -> 20"):
        applied = check_resume_config(saved, {**saved, "steps": 20, "resume": True, "new_field": 1})
    assert applied == {"steps": (10, 20)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_resume_config(saved, {**saved, "resume": True}) == {}


# -- 10. clear errors from data files ----------------------------------------------------------------------------------


CORPUS = [
    json.dumps({"id": "0", "contents": '"Alpha"\nAlpha is a letter.'}),
    json.dumps({"id": "1", "contents": '"Beta"\nB.'}),
]
TEST = [json.dumps({"id": "q0", "question": "What is Alpha?", "golden_answers": ["a letter"]})]


def flashrag(root: Path, corpus: bytes | None = None, test: bytes | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_bytes(corpus if corpus is not None else ("\n".join(CORPUS) + "\n").encode())
    (root / "test.jsonl").write_bytes(test if test is not None else ("\n".join(TEST) + "\n").encode())
    return root


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"id": "2", "contents": "\\"G\\"\\n\xff\xfe bad"}', "not valid UTF-8"),
        (b'{"id": "2", "contents": "\\"G\\"\\n\xed\xa0\x80 surrogate bytes"}', "not valid UTF-8"),
        (b'{"id": "2", "contents": "\\"G\\"\\n\\ud800 lone"}', "lone UTF-16 surrogate"),
    ],
    ids=["invalid utf-8", "encoded surrogate", "escaped surrogate"],
)
def test_bad_text_in_a_data_file_names_file_and_line(tmp_path: Path, line: bytes, message: str) -> None:
    root = flashrag(tmp_path / "d", corpus=("\n".join(CORPUS) + "\n").encode() + line + b"\n")
    with pytest.raises(DataFormatError, match=message) as err:
        load_flashrag(root)
    assert err.value.path == str(root / "corpus.jsonl") and err.value.line == 3


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    root = flashrag(tmp_path / "d", corpus=b"\xef\xbb\xbf" + ("\n".join(CORPUS) + "\n").encode())
    assert [p.id for p in load_flashrag(root).passages] == ["0", "1"]


def test_a_stray_jsonl_breaks_only_a_request_for_it(tmp_path: Path) -> None:
    root = flashrag(tmp_path / "d")
    (root / "results.jsonl").write_text('{"em": 1.0}\nnot json at all\n')
    dataset = load_dataset(root)
    assert [q.id for q in dataset.questions("test")] == ["q0"]
    with pytest.raises(DataFormatError, match=r"results.jsonl:1: missing field 'id'"):
        dataset.questions("results")
    with pytest.raises(DataFormatError, match=r"results\.jsonl"):
        load_flashrag(root, splits=("test", "results"))  # named splits are read at once


def test_env_on_a_folder_with_a_stray_file(tmp_path: Path) -> None:
    import gymnasium as gym

    import searchgym  # noqa: F401

    root = flashrag(tmp_path / "d")
    (root / "results.jsonl").write_bytes(b"\xff\xfe garbage\n")
    env = gym.make("SearchQA-v0", dataset=str(root), split="test")
    _, info = env.reset(seed=0)
    assert info["question"] == "What is Alpha?"
    env.close()


# -- supporting passage ids --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(["0", 1], ("0", "1")), (0, ("0",)), ("12", ("12",)), (None, ()), ([], ())],
)
def test_supporting_ids_accept_a_list_or_one_id(
    tmp_path: Path, value: Any, expected: tuple[str, ...]
) -> None:
    record = {
        "id": "q",
        "question": "?",
        "golden_answers": ["a"],
        "metadata": {"supporting_passage_ids": value},
    }
    root = flashrag(tmp_path / "d", test=json.dumps(record).encode() + b"\n")
    (question,) = load_flashrag(root).questions("test")
    assert question.supporting_ids == expected and question.hops == len(expected)


@pytest.mark.parametrize("value", [1.5, True, {"id": "0"}, [["0"]], ["0", None], [1.0]])
def test_supporting_ids_of_another_type_name_file_and_line(tmp_path: Path, value: Any) -> None:
    records = [
        {"id": "q0", "question": "?", "golden_answers": ["a"]},
        {"id": "q1", "question": "?", "golden_answers": ["a"], "metadata": {"gold_passage_ids": value}},
    ]
    root = flashrag(tmp_path / "d", test="".join(json.dumps(r) + "\n" for r in records).encode())
    with pytest.raises(DataFormatError, match=r"metadata\.gold_passage_ids") as err:
        load_flashrag(root).questions("test")
    assert err.value.path == str(root / "test.jsonl") and err.value.line == 2


@pytest.mark.parametrize(
    ("value", "expected"), [("12", ("12",)), (0, ("0",)), (["3", "4"], ("3", "4")), (None, ())]
)
def test_searchr1_rows_read_supporting_ids(tmp_path: Path, value: Any, expected: tuple[str, ...]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Question: who?"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
        "extra_info": {"index": 0, "supporting_passage_ids": value},
    }
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "test.parquet")
    (tmp_path / "corpus.jsonl").write_text(CORPUS[0] + "\n")
    (question,) = load_searchr1(tmp_path / "test.parquet").questions("test")
    assert question.supporting_ids == expected


def test_searchr1_rows_with_bad_supporting_ids_name_file_and_row(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"Question: q{i}?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
            "extra_info": {"index": i, "supporting_passage_ids": value},
        }
        for i, value in enumerate([1.0, 2.5])
    ]
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    (tmp_path / "corpus.jsonl").write_text(CORPUS[0] + "\n")
    with pytest.raises(DataFormatError, match=r"metadata\.supporting_passage_ids") as err:
        load_searchr1(path)
    assert err.value.path == str(path) and err.value.line == 1
