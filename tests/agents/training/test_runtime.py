"""``agents/training/run.py``: what every training entry point shares."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from searchgym.agents.training.config import ModelConfig, SFTConfig  # noqa: E402
from searchgym.agents.training.metrics import MetricLogger, read_metrics  # noqa: E402
from searchgym.agents.training.policy import build_policy, config_policy  # noqa: E402
from searchgym.agents.training.run import prepare_run_dir  # noqa: E402
from searchgym.app.cli import main  # noqa: E402
from searchgym.errors import ConfigError, DataFormatError  # noqa: E402


def test_a_configs_policy_has_its_model_seed_and_env_sizes() -> None:
    config = SFTConfig(tiny_layers=1, tiny_hidden=32, seed=5, max_turn_tokens=17, max_context_tokens=700)
    policy, arch = config_policy(config, temperature=0.5)
    assert (policy.max_turn_tokens, policy.temperature) == (17, 0.5)
    assert config_policy(config, max_turn_tokens=9)[0].max_turn_tokens == 9
    same, _ = build_policy(config.model, weights_seed=5, max_context_tokens=700)
    other, _ = build_policy(config.model, weights_seed=6, max_context_tokens=700)
    weights = [list(m.model.parameters()) for m in (policy, same, other)]
    assert all(torch.equal(a, b) for a, b in zip(weights[0], weights[1], strict=True))
    assert not all(torch.equal(a, c) for a, c in zip(weights[0], weights[2], strict=True))
    assert arch == build_policy(config.model, weights_seed=5, max_context_tokens=700)[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: --device cuda is valid here")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_usable_gpu_is_a_config_error(device: str) -> None:
    with pytest.raises(ConfigError, match=f"--device {device}") as caught:
        build_policy(ModelConfig(tiny_layers=1, tiny_hidden=32), device=device)
    if torch.version.cuda is None:  # the CPU build: the message says what to install, in one command
        assert "pip install torch --index-url https://download.pytorch.org/whl/cu" in str(caught.value)
        assert "constraints.txt" in str(caught.value)


# -- --model config:SPEC: an architecture with random weights ----------------------------------------


def _llama_config(tmp_path: Any) -> Any:
    import json

    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 32000,  # replaced by the tokenizer's
            }
        )
    )
    return path


def test_model_config_builds_that_architecture_seeded_and_sized_to_the_tokenizer(tmp_path: Any) -> None:
    path = _llama_config(tmp_path)
    policy, arch = build_policy(ModelConfig(name=f"config:{path}"), weights_seed=3)
    assert type(policy.model).__name__ == "LlamaForCausalLM"
    assert policy.model.config.num_hidden_layers == 2 and policy.model.config.hidden_size == 32
    assert policy.model.get_input_embeddings().weight.shape[0] == policy.tokenizer.vocab_size
    assert arch["kind"] == "config" and arch["config"]["model_type"] == "llama"
    again, _ = build_policy(
        ModelConfig(name=f"config:{tmp_path}"), weights_seed=3
    )  # a folder holding config.json
    other, _ = build_policy(ModelConfig(name=f"config:{path}"), weights_seed=4)
    same = [
        torch.equal(a, b) for a, b in zip(policy.model.parameters(), again.model.parameters(), strict=True)
    ]
    differ = [
        torch.equal(a, b) for a, b in zip(policy.model.parameters(), other.model.parameters(), strict=True)
    ]
    assert all(same) and not all(differ)


def test_a_config_model_checkpoint_rebuilds_it(tmp_path: Any) -> None:
    from searchgym.agents.training.checkpoint import save_checkpoint

    policy, arch = build_policy(ModelConfig(name=f"config:{_llama_config(tmp_path)}"), weights_seed=3)
    ckpt = save_checkpoint(
        tmp_path / "checkpoint.pt",
        {"kind": "sft", "step": 1, "model": policy.model.state_dict(), "arch": arch, "config": {}},
    )
    loaded, loaded_arch = build_policy(
        ModelConfig(init=str(ckpt)), weights_seed=99
    )  # the weights come from the file
    assert loaded_arch == arch
    for a, b in zip(policy.model.parameters(), loaded.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_shipped_model_configs_and_bad_specs(tmp_path: Any) -> None:
    from searchgym.agents.training.policy import read_model_config

    qwen = read_model_config("qwen2-0.5b")
    assert qwen["model_type"] == "qwen2" and qwen["hidden_size"] == 896 and qwen["num_hidden_layers"] == 24
    with pytest.raises(ConfigError, match=r"cannot read a model config.*qwen2-0\.5b"):
        read_model_config(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ConfigError, match="no 'model_type'"):
        read_model_config(str(tmp_path / "bad.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="JSONDecodeError"):
        read_model_config(str(tmp_path / "broken.json"))


def test_a_checkpoint_with_a_malformed_config_arch_is_refused(tmp_path: Any) -> None:
    from searchgym.agents.training.checkpoint import save_checkpoint
    from searchgym.errors import CheckpointError

    for arch in ({"kind": "config", "config": "llama"}, {"kind": "config", "config": {"hidden_size": 8}}):
        ckpt = save_checkpoint(
            tmp_path / "c.pt", {"kind": "sft", "step": 1, "model": {}, "arch": arch, "config": {}}
        )
        with pytest.raises(CheckpointError, match="'model_type'"):
            build_policy(ModelConfig(init=str(ckpt)))


# -- the run folder --------------------------------------------------------------------------------------------


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
    assert "already holds a run" in err and "--overwrite" in err
    assert ("--resume" in err) == (command == "grpo")  # only GRPO can continue a run
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


# -- the metric log --------------------------------------------------------------------------------------------


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
