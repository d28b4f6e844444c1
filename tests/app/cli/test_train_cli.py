"""``searchgym train grpo|sft`` and ``plot``: options from the config, kill-and-resume, tiny end-to-end runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.config import GRPOConfig
from searchgym.agents.integrations.config import TRLConfig
from searchgym.agents.training.config import SFTConfig
from searchgym.app.cli import build_parser, main
from searchgym.options import flat_values, is_section

TINY = [
    "--max-turns", "2",
    "--max-turn-tokens", "8",
    "--max-context-tokens", "768",
    "--questions-per-step", "2",
    "--group-size", "2",
    "--minibatch-size", "2",
    "--eval-questions", "0",
    "--threads", "1",
    "--no-progress",
    "--no-tensorboard",
]  # fmt: skip


def steps_logged(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_help_is_generated_from_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "grpo", "--help"])
    out = capsys.readouterr().out
    for flag in ("--llds {none,action,response,token}", "--lambda", "--llds-ma", "--init", "--resume"):
        assert flag in out
    assert "responses per question (G)" in out


@pytest.mark.parametrize("command", ["grpo", "trl", "sft"])
def test_help_reads_in_sections(capsys: pytest.CaptureFixture[str], command: str) -> None:
    with pytest.raises(SystemExit):
        main(["train", command, "--help"])
    titles = [
        line[:-1] for line in capsys.readouterr().out.splitlines() if line.endswith(":") and line[0].isalpha()
    ]
    assert titles[:4] == ["options", "run", "model", "environment"] and "other options" not in titles
    assert ("LLDS" in titles) == (command != "sft")
    cls = {"grpo": GRPOConfig, "trl": TRLConfig, "sft": SFTConfig}[command]
    sections = [f.metadata["section"] for f in dataclasses.fields(cls) if is_section(f)]
    assert titles == ["options", *sections]  # one group per section, titled by it, in the config's order


def test_each_option_is_in_its_sections_group(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "grpo", "--help"])
    group, where = "", {}
    for line in capsys.readouterr().out.splitlines():
        if line.endswith(":") and line[0].isalpha():
            group = line[:-1]
        elif line.startswith("  --"):
            where[line.split()[0].rstrip(",")] = group
    assert where["--group-size"] == where["--steps"] == "batches"
    assert where["--model"] == where["--precision"] == "model"
    assert where["--clip-eps"] == where["--rescore-pi-old"] == "loss"
    assert where["--ledger-size"] == where["--log-gns"] == "diagnostics"
    assert where["--save-every"] == where["--seed"] == "run"


SHARED_IDEAS = ("--epochs", "--micro-batch-size", "--save-every", "--minibatch-size", "--questions-per-step")


def test_train_trl_and_train_grpo_share_option_names(capsys: pytest.CaptureFixture[str]) -> None:
    flags = {}
    for command in ("grpo", "trl"):
        with pytest.raises(SystemExit):
            main(["train", command, "--help"])
        lines = capsys.readouterr().out.splitlines()  # an option's line starts with its flag
        flags[command] = {line.split()[0] for line in lines if line.startswith("  --")}
    for flag in SHARED_IDEAS:
        assert flag in flags["grpo"] and flag in flags["trl"], flag
    # --steps counts rollout batches in train grpo; train trl counts optimizer updates, under its own name.
    assert "--steps" in flags["grpo"] and "--updates" in flags["trl"] and "--steps" not in flags["trl"]


@pytest.mark.parametrize(
    ("old", "new", "field", "value"),
    [
        ("--steps", "--updates", "updates", 7),
        ("--num-iterations", "--epochs", "epochs", 2),
        ("--micro-batch", "--micro-batch-size", "micro_batch_size", 1),
        ("--save-steps", "--save-every", "save_every", 3),
    ],
)
def test_old_train_trl_option_names_still_work_and_say_their_new_name(
    capsys: pytest.CaptureFixture[str], old: str, new: str, field: str, value: int
) -> None:
    from searchgym.agents.integrations.config import TRLConfig
    from searchgym.app.cli import build_parser
    from searchgym.app.cli._options import config_from_args

    args = build_parser().parse_args(["train", "trl", old, str(value)])
    assert flat_values(config_from_args(TRLConfig, args))[field] == value
    assert f"searchgym: {old} is deprecated; use {new}" in capsys.readouterr().err
    build_parser().parse_args(["train", "trl", new, str(value)])
    assert "deprecated" not in capsys.readouterr().err


def test_bad_option_is_a_config_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["train", "grpo", "--group-size", "1", "--run-dir", str(tmp_path)]) == 2
    assert "group_size must be >= 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["grpo", "--steps", "0"], "steps must be >= 1, got 0"),
        (["grpo", "--llds-ma-beta", "1.5"], "llds_ma_beta must be >= 0.0 and <= 1.0 or None, got 1.5"),
        (["sft", "--eval-questions", "-1"], "eval_questions must be >= 0, got -1"),
        (["trl", "--warning-window", "0"], "warning_window must be >= 1, got 0"),
    ],
)
def test_an_option_outside_its_declared_bounds_is_one_error_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["train", *argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert line in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_sft_into_a_folder_holding_a_run_offers_what_sft_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "sft"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')  # what an interrupted run leaves
    assert main(["train", "sft", "--run-dir", str(run)]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("note:")]
    assert len(err) == 1 and "pass --overwrite to train it again" in err[0], err
    assert "--resume" not in err[0]  # train sft has no --resume to offer
    with pytest.raises(SystemExit, match="2"):  # and does not take one
        main(["train", "sft", "--run-dir", str(run), "--resume"])
    assert "train sft: unrecognized option --resume" in capsys.readouterr().err


def test_demos_name_the_command_that_trains_on_them_and_sft_says_what_it_trains_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    demos = tmp_path / "runs" / "demos.jsonl"
    assert main(["demos", "--episodes", "2", "--out", str(demos)]) == 0
    out = capsys.readouterr().out
    assert f"train on them with: searchgym train sft --demos {demos} --run-dir RUN_DIR" in out
    import searchgym.agents.sft as sft

    monkeypatch.setattr(sft, "train_sft", lambda config: {})  # what is printed before training, only
    assert main(["train", "sft", "--run-dir", str(tmp_path / "a")]) == 0
    assert "note: training on oracle demonstrations generated from split 'train' (--demos FILE" in (
        capsys.readouterr().err
    )
    assert main(["train", "sft", "--run-dir", str(tmp_path / "b"), "--demos", str(demos)]) == 0
    assert "note: training on oracle" not in capsys.readouterr().err


@pytest.mark.slow
def test_sigkill_then_resume_continues_from_the_saved_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    steps = 3
    cmd = [sys.executable, "-m", "searchgym.app.cli", "train", "grpo", "--run-dir", str(run), *TINY]
    cmd += ["--steps", str(steps), "--save-every", "1", "--llds", "action"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    checkpoint = run / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists(), proc.stderr.read().decode() if proc.stderr else ""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    from searchgym.agents.training.checkpoint import load_checkpoint

    saved = load_checkpoint(checkpoint)["step"]
    assert 1 <= saved < steps, "the run should be killed before it finishes"
    assert main(["train", "grpo", "--run-dir", str(run), *TINY, "--steps", str(steps), "--resume"]) == 0
    assert load_checkpoint(checkpoint)["step"] == steps
    assert steps_logged(run) == list(range(steps + 1))  # step 0 (the initial probes) and every step, once


@pytest.mark.slow
def test_sft_then_grpo_from_it_then_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sft = tmp_path / "sft"
    common = ["--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "768", "--threads", "1"]
    args = ["train", "sft", "--run-dir", str(sft), *common, "--demo-episodes", "8", "--epochs", "1"]
    assert (
        main([*args, "--batch-size", "4", "--eval-questions", "2", "--eval-batch", "2", "--no-progress"]) == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= report["eval/em"] <= 1.0 and 0 < report["sft/demonstrations"] <= 8
    grpo = tmp_path / "grpo"
    init = str(sft / "checkpoint.pt")
    assert main(["train", "grpo", "--run-dir", str(grpo), *TINY, "--steps", "1", "--init", init]) == 0
    out = tmp_path / "plot.png"
    assert main(["plot", str(grpo), str(sft), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_eval_of_a_checkpoint_defaults_to_its_training_turn_sizes(tmp_path: Path) -> None:
    from searchgym.app.cli._common import env_spec_from_args
    from searchgym.app.cli.eval import env_defaults, trained_env_spec, with_trained_sizes
    from searchgym.envs import EnvSpec

    sft = tmp_path / "sft"
    common = ["--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "768", "--threads", "1"]
    args = ["train", "sft", "--run-dir", str(sft), *common, "--demo-episodes", "4", "--epochs", "1"]
    assert main([*args, "--eval-questions", "0", "--no-progress"]) == 0
    agent = f"checkpoint:{sft / 'checkpoint.pt'}"
    trained = trained_env_spec(agent)  # the checkpoint's stored spec, whole
    assert isinstance(trained, EnvSpec) and (trained.max_turns, trained.max_turn_tokens) == (2, 8)
    assert trained_env_spec("oracle") is None and trained_env_spec(f"checkpoint:{tmp_path / 'no.pt'}") is None
    defaults = with_trained_sizes(env_defaults(), trained)
    unset = build_parser().parse_args(["eval", "--agent", agent])
    played = env_spec_from_args(unset, defaults)
    assert (played.max_turn_tokens, played.max_context_tokens, played.split) == (8, 768, "test")
    assert played.max_turns == EnvSpec().max_turns  # only the sizes come from training
    given = build_parser().parse_args(["eval", "--agent", agent, "--max-turn-tokens", "16"])
    assert env_spec_from_args(given, defaults).max_turn_tokens == 16  # what the user gives wins
    out = tmp_path / "episodes.jsonl"
    assert main(["eval", "--agent", agent, "--episodes", "2", "--no-progress", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_changed_lr_on_resume_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", "grpo", "--run-dir", str(run), *TINY, "--steps", "1"]) == 0
    capsys.readouterr()
    assert (
        main(["train", "grpo", "--run-dir", str(run), *TINY, "--steps", "2", "--resume", "--lr", "0.5"]) == 2
    )
    assert "--lr: saved 0.0003, now 0.5" in capsys.readouterr().err


# -- Ctrl-C ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_during_train_grpo_is_one_line_naming_the_checkpoint_and_the_resume_command(
    tmp_path: Path,
) -> None:
    from searchgym.agents.training.checkpoint import load_checkpoint

    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "searchgym.app.cli",
        "train",
        "grpo",
        "--run-dir",
        str(run),
    ]
    cmd += [*TINY, "--probe-size", "0", "--onpolicy-probe-size", "0", "--steps", "500", "--save-every", "1"]
    # As from a terminal: a parent started in the background without job control (a CI runner) hands its
    # children SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    checkpoint = run / "checkpoint.pt"
    deadline = time.monotonic() + 180
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists() and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # a hang: fail with what every thread was doing
        proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"train grpo still running 120 s after Ctrl-C; its threads:\n{err[-8000:]}")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1]
    assert last.startswith("searchgym: train grpo interrupted;") and str(checkpoint) in last
    saved = load_checkpoint(checkpoint)["step"]
    assert f"holds step {saved};" in last
    assert last.endswith(f"continue with: searchgym train grpo --run-dir {run} --resume")


def test_ctrl_c_messages_of_each_training_command(tmp_path: Path) -> None:
    from searchgym.app.cli._common import interrupted_message

    def message(*command: str, **fields: Any) -> str:
        return interrupted_message(argparse.Namespace(_command=command, run_dir=str(tmp_path), **fields))

    assert "before its first checkpoint; nothing to resume" in message("train", "grpo", resume=False)
    assert message("train", "sft").endswith(
        f"start again with: searchgym train sft --run-dir {tmp_path} --overwrite ..."
    )
    for step in (2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    trl = message("train", "trl", resume=False)
    assert f"newest checkpoint is {tmp_path / 'checkpoint-10'};" in trl
    assert trl.endswith(f"continue with: searchgym train trl --run-dir {tmp_path} --resume")
    assert interrupted_message(argparse.Namespace(_command=("eval",))) == "searchgym: eval interrupted"
