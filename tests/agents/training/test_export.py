"""Trained models out of searchgym: `eval --agent checkpoint:…` and the Hugging Face export round trip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.training.checkpoint import save_checkpoint  # noqa: E402
from searchgym.agents.training.config import ModelConfig  # noqa: E402
from searchgym.agents.training.export import export_pretrained, load_policy  # noqa: E402
from searchgym.agents.training.policy import build_policy  # noqa: E402
from searchgym.app.cli import main  # noqa: E402
from searchgym.errors import CheckpointError, ConfigError  # noqa: E402

from ..conftest import RunsCode  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    policy, arch = build_policy(ModelConfig(tiny_layers=1, tiny_hidden=32), weights_seed=3)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pt"
    save_checkpoint(path, {"kind": "sft", "model": policy.model.state_dict(), "arch": arch, "step": 0})
    return path


def eval_json(agent: str, capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    argv = ["eval", "--agent", agent, "--episodes", "3", "--max-turns", "2", "--max-turn-tokens", "6"]
    assert main([*argv, "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_eval_plays_a_checkpoint_and_its_export_identically(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from_checkpoint = eval_json(f"checkpoint:{checkpoint}", capsys)
    assert from_checkpoint["episodes"] == 3 and "em" in from_checkpoint
    out = export_pretrained(checkpoint, tmp_path / "hf")
    from_folder = eval_json(f"checkpoint:{out}", capsys)
    drop = {"episodes_per_s", "seconds", "tokens_per_s"}
    assert {k: v for k, v in from_folder.items() if k not in drop} == {
        k: v for k, v in from_checkpoint.items() if k not in drop
    }


def test_export_writes_every_file_with_the_same_usual_mode(checkpoint: Path, tmp_path: Path) -> None:
    import os

    umask = os.umask(0o022)
    try:
        out = export_pretrained(checkpoint, tmp_path / "hf")
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


@pytest.mark.slow
def test_export_loads_with_plain_transformers_and_gives_the_same_logits(
    checkpoint: Path, tmp_path: Path
) -> None:
    out = export_pretrained(checkpoint, tmp_path / "hf")
    policy = load_policy(checkpoint)
    ids = policy.tokenizer.encode("Question: who founded Varnholt? <search> Varnholt </search>")
    with torch.no_grad():
        expected = policy.model(input_ids=torch.tensor([ids])).logits[0, :, : policy.vocab_size]
    np_path = tmp_path / "logits.pt"
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained({str(out)!r})
tok = AutoTokenizer.from_pretrained({str(out)!r})
ids = tok.encode("Question: who founded Varnholt? <search> Varnholt </search>", add_special_tokens=False)
assert ids == {ids!r}, ids
with torch.no_grad():
    torch.save(model(input_ids=torch.tensor([ids])).logits[0], {str(np_path)!r})
assert not any(m.startswith("searchgym") for m in sys.modules), "the export must not need searchgym"
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=300)
    got = torch.load(np_path)[:, : policy.vocab_size]
    assert torch.allclose(got, expected, atol=1e-5)


def test_export_and_load_errors(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        export_pretrained(checkpoint, tmp_path / "busy")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match=r"without config\.json"):
        load_policy(tmp_path / "busy")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_policy(tmp_path / "missing.pt")


def test_an_exported_folder_plays_exactly_as_its_checkpoint(tmp_path: Path) -> None:
    sft = tmp_path / "sft"
    sizes = ["--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "768"]
    args = ["train", "sft", "--run-dir", str(sft), *sizes, "--demo-episodes", "8", "--epochs", "1"]
    assert main([*args, "--eval-questions", "0", "--threads", "1", "--no-progress", "--no-tensorboard"]) == 0
    assert main(["export", str(sft / "checkpoint.pt"), str(tmp_path / "hf")]) == 0
    note = json.loads((tmp_path / "hf" / "searchgym_export.json").read_text())
    from searchgym.envs.spec import TRAINING

    # the note stores the run's whole env spec, as its checkpoint does
    assert note["env"] == TRAINING.replace(max_turns=2, max_turn_tokens=8, max_context_tokens=768).to_dict()
    transcripts = {}
    for name, agent in (("ckpt", sft / "checkpoint.pt"), ("hf", tmp_path / "hf")):
        out = tmp_path / f"{name}.jsonl"
        assert main(["eval", "--agent", f"checkpoint:{agent}", "--max-turns", "2", "--episodes", "6",
                     "--out", str(out), "--no-progress"]) == 0  # fmt: skip
        transcripts[name] = [json.loads(line) for line in out.read_text().splitlines()]
    strip = ("seconds", "agent")
    assert [{k: v for k, v in r.items() if k not in strip} for r in transcripts["hf"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in transcripts["ckpt"]
    ]


@pytest.mark.parametrize(
    "env",
    [{"max_turn_tokens": "abc"}, {"max_context_tokens": 10**12}, [], {"max_turn_tokens": 0}, {"topk": 0}],
)
def test_a_bad_export_note_is_a_checkpoint_error(tmp_path: Path, env: Any) -> None:
    from searchgym.agents.training.export import checkpoint_env_spec

    (tmp_path / "searchgym_export.json").write_text(json.dumps({"env": env}))
    with pytest.raises(CheckpointError, match=r"searchgym_export\.json"):
        checkpoint_env_spec(tmp_path)
    (tmp_path / "searchgym_export.json").write_text('{"env": {"max_turn_tokens": 1' + "0" * 5000 + "}}")
    with pytest.raises(CheckpointError, match="not a readable export note"):
        checkpoint_env_spec(tmp_path)


def test_an_export_notes_spec_is_read_whole(tmp_path: Path) -> None:
    from searchgym.agents.training.export import checkpoint_env_spec
    from searchgym.envs import EnvSpec

    assert checkpoint_env_spec(tmp_path) is None  # a folder without a note: nothing recorded
    spec = EnvSpec(topk=5, max_turn_tokens=8, retriever_faults="empty=0.5,seed=2", prompt_style="chat")
    (tmp_path / "searchgym_export.json").write_text(json.dumps({"env": spec.to_dict()}))
    assert checkpoint_env_spec(tmp_path) == spec
    (tmp_path / "searchgym_export.json").write_text(json.dumps({"env": {"max_context_tokens": 768}}))
    assert checkpoint_env_spec(tmp_path) == EnvSpec(max_context_tokens=768)  # a note of sizes only


def test_a_pickled_pytorch_model_bin_in_a_hf_folder_is_a_typed_error(tmp_path: Path) -> None:
    from searchgym.agents.llm import tiny_causal_lm

    folder = tmp_path / "hf"
    tiny_causal_lm(512, layers=1, hidden=16).save_pretrained(folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": RunsCode(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="cannot be loaded safely") as err:
        load_policy(folder)
    assert (
        "pytorch_model.bin" in str(err.value)
        or "UnpicklingError" in str(err.value)
        or "weights" in str(err.value)
    )
    assert not marker.exists()
