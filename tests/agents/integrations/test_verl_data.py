"""``searchgym prepare verl`` (no verl needed) and the verl integration's import without verl."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from searchgym.app.cli import main
from searchgym.errors import ConfigError, install_command

pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra is part of `all`")

from searchgym.agents.integrations.verl_data import (  # noqa: E402
    AGENT_NAME,
    ENV_KEYS,
    question_rows,
    write_verl_parquet,
)
from searchgym.data import load_dataset  # noqa: E402
from searchgym.envs import EnvSpec  # noqa: E402

# The columns verl's RLHFDataset reads (prompt_key "prompt", data_source, extra_info.index) plus the agent loop's.
COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"]


def test_prepare_verl_writes_one_parquet_per_split_that_round_trips(tmp_path: Path, capsys) -> None:
    argv = ["prepare", "verl", "--out", str(tmp_path / "data"), "--split", "train", "--split", "test"]
    code = main([*argv, "--limit", "5", "--max-turns", "3", "--retriever", "http://127.0.0.1:8000/retrieve"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"train", "test"}
    world = load_dataset(None)
    for split in ("train", "test"):
        table = pq.read_table(printed[split])
        assert table.column_names == COLUMNS
        rows = table.to_pylist()
        questions = world.questions(split)[:5]
        assert [r["extra_info"]["question_id"] for r in rows] == [q.id for q in questions]
        assert [r["extra_info"]["index"] for r in rows] == list(range(5))
        assert [r["reward_model"]["ground_truth"]["target"] for r in rows] == [
            list(q.golden_answers) for q in questions
        ]
        assert all(r["agent_name"] == AGENT_NAME and r["prompt"][0]["role"] == "user" for r in rows)
        assert questions[0].question.rstrip("?") in rows[0]["prompt"][0]["content"]
        env = json.loads(rows[0]["extra_info"]["searchgym_env"])
        assert env["split"] == split and env["max_turns"] == 3
        assert env["retriever"] == "http://127.0.0.1:8000/retrieve"
        assert env["dataset"] is None  # the generated world: nothing to reopen
        assert set(env) == set(EnvSpec.field_names())  # the whole spec: what the agent loop reads back
        assert EnvSpec.from_record(env).max_turns == 3 and EnvSpec.from_record(env).split == split


def test_a_dataset_folder_is_stored_as_an_absolute_path(tmp_path: Path, quickstart_dir: Path) -> None:
    paths = write_verl_parquet(tmp_path, EnvSpec(dataset=str(quickstart_dir)), ["test"], limit=2)
    env = json.loads(pq.read_table(paths["test"]).to_pylist()[0]["extra_info"]["searchgym_env"])
    assert Path(env["dataset"]).is_absolute() and Path(env["dataset"]) == quickstart_dir.resolve()


def test_slices_of_one_split_are_written_under_names_hydra_takes(tmp_path: Path) -> None:
    paths = write_verl_parquet(tmp_path, EnvSpec(), ["test[:3]", "test[997:]"])
    assert [p.name for p in paths.values()] == ["test_0-3.parquet", "test_997-end.parquet"]
    tests = load_dataset(None).questions("test")
    for split, ids in (("test[:3]", tests[:3]), ("test[997:]", tests[997:])):
        rows = pq.read_table(paths[split]).to_pylist()
        assert [r["extra_info"]["question_id"] for r in rows] == [q.id for q in ids]
        assert json.loads(rows[0]["extra_info"]["searchgym_env"])["split"] == split
    with pytest.raises(ConfigError, match="would write the same file twice"):
        write_verl_parquet(tmp_path, EnvSpec(), ["test[:3]", " test[:3]"])


def test_bad_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no split 'nope'"):
        write_verl_parquet(tmp_path, EnvSpec(), ["nope"])
    with pytest.raises(ConfigError, match="takes an EnvSpec, got dict"):
        question_rows({"max_turns": 3})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="as a path"):
        question_rows(EnvSpec(dataset=load_dataset(None)))
    with pytest.raises(ConfigError, match="at least one split"):
        write_verl_parquet(tmp_path, EnvSpec(), [])


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
def test_without_verl_the_integration_names_the_extra() -> None:
    code = (
        "from searchgym.errors import MissingDependencyError\n"
        "try:\n"
        "    import searchgym.agents.integrations.verl\n"
        "except MissingDependencyError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert f"Install it with: {install_command('verl')}" in out.stdout


def test_prepare_verl_shows_the_error_verl_would_hide(tmp_path: Path) -> None:
    """A verl whose modules the plugin cannot import (here a stand-in package): prepare prints the real error."""
    fake = tmp_path / "site" / "verl"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")  # no verl.trainer: the plugin's first verl import fails
    command = [sys.executable, "-m", "searchgym.app.cli", "prepare", "verl"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run(
        [*command, "--out", str(tmp_path / "data")], capture_output=True, text=True, cwd="/", env=env
    )
    assert out.returncode == 1, out.stderr
    assert (tmp_path / "data" / "train.parquet").is_file()  # written before the check
    assert "Agent loop searchgym not registered" in out.stderr
    assert "No module named 'verl." in out.stderr  # the import's own error, with its traceback
    assert "Traceback" in out.stderr
    skipped = subprocess.run(
        [*command, "--out", str(tmp_path / "d2"), "--no-plugin-check"],
        capture_output=True,
        text=True,
        cwd="/",
        env=env,
    )
    assert skipped.returncode == 0, skipped.stderr


def test_a_row_may_carry_every_spec_field() -> None:
    from searchgym.envs import EnvSpec

    assert EnvSpec.field_names() == ENV_KEYS


def test_prepare_verl_writes_every_env_option_into_the_rows(tmp_path: Path, capsys) -> None:
    argv = ["prepare", "verl", "--out", str(tmp_path), "--limit", "2", "--no-plugin-check"]
    options = ["--retriever-faults", "empty=0.5,seed=1", "--on-retrieval-error", "observe"]
    assert main([*argv, *options, "--max-passage-words", "40", "--no-append-question-mark"]) == 0
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    env = json.loads(rows[0]["extra_info"]["searchgym_env"])
    assert env["on_retrieval_error"] == "observe"
    assert (
        EnvSpec.from_record(env).retriever_faults
        == EnvSpec(retriever_faults="empty=0.5,seed=1").retriever_faults
    )
    assert env["max_passage_words"] == 40 and env["append_question_mark"] is False
    assert env["max_context_tokens"] == 4096  # prepare verl's own default: room for a real model's turns
    capsys.readouterr()
    assert main([*argv, "--topk", "0"]) == 2
    assert "topk" in capsys.readouterr().err
