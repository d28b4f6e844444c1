"""Run manifests: the fields every run folder records, and the warning on a corpus or index mismatch."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from searchgym.app.cli import main
from searchgym.app.cli._manifest import env_record, warn_on_data_mismatch, write_config_manifest
from searchgym.envs import EnvSpec
from searchgym.errors import ConfigError
from searchgym.manifest import (
    corpus_mismatch,
    dataset_fingerprint,
    file_digest,
    folder_digest,
    read_manifest,
    retriever_fingerprint,
    run_manifest,
)


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def flashrag_folder(root: Path, text: str = "Zorvath founded Kestrel Bay.") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    passages = [
        {"id": "0", "contents": f'"Zorvath"\n{text}'},
        {"id": "1", "contents": '"Kestrel Bay"\nA city.'},
    ]
    (root / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
    question = {"id": "q0", "question": "Who founded Kestrel Bay?", "golden_answers": ["Zorvath"]}
    (root / "test.jsonl").write_text(json.dumps(question) + "\n")
    return root


def test_a_manifest_holds_versions_git_state_env_options_seeds_and_config() -> None:
    spec = EnvSpec(split="test", reward="f1", prompt_style="chat", retriever_faults="empty=0.1")
    env = {**spec.to_record(), "tokenizer": None}
    manifest = run_manifest(
        "eval", env, seeds={"seed": 4}, config={"x": Path("a")}, argv=["searchgym", "eval"]
    )
    versions = manifest["versions"]
    assert {"searchgym", "python", "numpy", "gymnasium", "torch", "transformers"} <= set(versions)
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    git = manifest["git"]
    assert git is None or len(git["commit"]) == 40  # this checkout: a commit
    data = manifest["data"]
    assert data["dataset"] == "world" and data["split"] == "test" and data["world_seed"] == 0
    assert data["questions_sha256"].startswith("sha256:") and data["corpus_sha256"].startswith("sha256:")
    assert manifest["retriever"] == {
        "kind": "bm25", "spec": "bm25", "topk": 3, "index_sha256": None,
        "faults": {**manifest["retriever"]["faults"], "empty": 0.1},
    }  # fmt: skip
    assert manifest["tokenizer"]["name"] == "builtin" and manifest["tokenizer"]["vocab_size"] == 8192
    assert manifest["tokenizer"]["sha256"].startswith("sha256:")
    assert manifest["episode"]["prompt_style"] == "chat" and manifest["reward"]["metric"] == "f1"
    from searchgym import rewards

    assert manifest["reward"]["rewards_sha256"] == sha256(Path(rewards.__file__))  # the normaliser's code
    assert manifest["seeds"] == {"seed": 4} and manifest["config"] == {"x": "a"}
    assert manifest["argv"] == ["searchgym", "eval"]
    json.dumps(manifest)  # serialisable as is


def test_hashes_follow_the_content(tmp_path: Path) -> None:
    folder = flashrag_folder(tmp_path / "data")
    fp = dataset_fingerprint(str(folder), "test")
    assert fp["corpus_sha256"] == sha256(folder / "corpus.jsonl")
    assert fp["questions_sha256"] == sha256(folder / "test.jsonl")
    other = dataset_fingerprint(str(flashrag_folder(tmp_path / "other", text="Someone else.")), "test")
    assert (
        other["corpus_sha256"] != fp["corpus_sha256"] and other["questions_sha256"] == fp["questions_sha256"]
    )
    assert (
        dataset_fingerprint(None, "test", 1)["corpus_sha256"]
        != dataset_fingerprint(None, "test", 0)["corpus_sha256"]
    )
    # An index folder's hash covers its files, not a manifest or hidden records written into it.
    index = tmp_path / "index"
    index.mkdir()
    (index / "vectors.npy").write_bytes(b"\x00" * 64)
    before = folder_digest(index)
    (index / "manifest.json").write_text("{}")
    (index / ".verified.json").write_text("{}")
    assert folder_digest(index) == before
    assert retriever_fingerprint(f"dense:{index}", 3)["index_sha256"] == before
    (index / "vectors.npy").write_bytes(b"\x01" * 64)
    assert folder_digest(index) != before
    cassette = tmp_path / "c.json.gz"
    cassette.write_bytes(b"abc")
    assert (
        retriever_fingerprint(f"cassette:{cassette}")["index_sha256"]
        == file_digest(cassette)
        == sha256(cassette)
    )


def test_eval_out_and_index_write_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs" / "e.jsonl"
    argv = ["eval", "--agent", "oracle", "--episodes", "3", "--no-progress", "--seed", "5", "--out", str(out)]
    assert main(argv) == 0
    manifest = read_manifest(tmp_path / "runs" / "e.jsonl.manifest.json")
    assert manifest is not None and manifest["command"] == "eval" and manifest["seeds"] == {"seed": 5}
    assert manifest["config"]["agent"] == "oracle" and manifest["data"]["split"] == "test"
    index = tmp_path / "bm25"
    assert main(["index", "bm25", "--corpus", "world", "--out", str(index), "--no-progress"]) == 0
    manifest = read_manifest(index / "manifest.json")
    assert manifest is not None and manifest["command"] == "index bm25"
    assert manifest["index"]["index_sha256"] == folder_digest(index)
    assert manifest["data"]["corpus_sha256"] == dataset_fingerprint(None, None)["corpus_sha256"]
    capsys.readouterr()


def test_a_training_config_writes_its_manifest(tmp_path: Path) -> None:
    from searchgym.agents.training.config import SFTConfig

    config = SFTConfig(run_dir=str(tmp_path / "run"), seed=3, world_seed=1, model="config:qwen2-0.5b")
    path = write_config_manifest(config, "train sft")
    manifest = read_manifest(path)
    assert manifest is not None and path == tmp_path / "run" / "manifest.json"
    assert manifest["seeds"] == {"seed": 3, "world_seed": 1} and manifest["data"]["world_seed"] == 1
    assert manifest["config"]["run_dir"] == str(tmp_path / "run")
    assert manifest["tokenizer"]["name"] == "builtin"  # a config: model plays with the built-in tokenizer
    assert manifest["episode"]["max_turn_tokens"] == config.env.max_turn_tokens


def test_the_mismatch_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    trained = run_manifest("train grpo", EnvSpec().to_record(), argv=[])
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(trained))
    agent = f"checkpoint:{run / 'checkpoint.pt'}"
    assert (
        warn_on_data_mismatch(agent, {"world_seed": 0, "split": "test"}) is None
    )  # another split: same corpus
    line = warn_on_data_mismatch(agent, {"world_seed": 1, "split": "test"})
    assert line is not None and "corpus" in line and "\n" not in line
    assert capsys.readouterr().err.strip() == line
    assert warn_on_data_mismatch(f"sb3:{run / 'model.zip'}", {"world_seed": 1}) is not None
    assert warn_on_data_mismatch("heuristic", {"world_seed": 1}) is None
    index = {"retriever": {"index_sha256": "sha256:aa"}}
    assert (
        corpus_mismatch(index, {"retriever": {"index_sha256": "sha256:bb"}})
        == "index aa (trained) vs bb (this env)"
    )
    assert corpus_mismatch({}, {"data": {"corpus_sha256": "x"}}) is None  # nothing recorded, nothing to say


@pytest.mark.slow
def test_train_then_eval_on_another_corpus_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "sft"
    budget = ["--demo-episodes", "24", "--epochs", "1", "--eval-questions", "0", "--tiny-layers", "1"]
    assert main(["train", "sft", "--run-dir", str(run), "--no-progress", *budget]) == 0
    manifest = read_manifest(run / "manifest.json")
    assert manifest is not None and manifest["command"] == "train sft"
    capsys.readouterr()
    agent = ["eval", "--agent", f"checkpoint:{run / 'checkpoint.pt'}", "--episodes", "1", "--no-progress"]
    assert main(agent) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*agent, "--world-seed", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("searchgym: warning:") == 1 and "trained on another corpus" in err


def test_a_manifest_reads_every_field_of_the_env_record_and_refuses_a_partial_one() -> None:
    with pytest.raises(ConfigError, match=r"lacks \['retriever', 'retriever_faults', 'reward', 'topk'\]"):
        run_manifest("eval", {"dataset": None, "world_seed": 0, "split": "test"}, argv=[])


def test_settings_given_as_a_mapping_take_the_specs_defaults_for_the_rest() -> None:
    """An older run's settings (some fields missing) are completed by the spec's own defaults, the split
    included: the one converter, no default written a second time."""
    record = env_record({"world_seed": 2, "tokenizer": "gpt2"})
    assert record == {**EnvSpec(world_seed=2).to_record(), "tokenizer": "gpt2"}
    assert record["split"] == EnvSpec().split
    assert env_record(EnvSpec(split="dev")) == EnvSpec(split="dev").to_record()
    manifest = run_manifest("eval", env_record({"split": "test"}), argv=[])
    assert manifest["data"]["split"] == "test" and manifest["retriever"]["topk"] == EnvSpec().topk
