"""``--report-to tensorboard|wandb|none`` on every trainer: the reporters, the optional wandb, the alias
``--no-tensorboard``; W&B is a stand-in module in ``sys.modules``, driven in offline mode, with no network."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from searchgym.agents.training.config import SFTConfig
from searchgym.agents.training.metrics import MetricLogger, read_metrics
from searchgym.agents.training.reporting import WANDB_RUN_ID
from searchgym.app.cli import build_parser, main
from searchgym.errors import MissingDependencyError, install_command

TRAINERS = ("sft", "grpo", "trl", "sb3")


class FakeWandbRun:
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.finished = False

    def log(self, data: dict[str, float], step: int) -> None:
        assert not self.finished
        self.logged.append((step, dict(data)))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[FakeWandbRun]:
    """A ``wandb`` module that keeps its runs in a list; like wandb in offline mode, it writes the run under
    ``dir/wandb`` and refuses to start unless ``WANDB_MODE=offline`` (this test has no network)."""
    runs: list[FakeWandbRun] = []

    def init(**settings: Any) -> FakeWandbRun:
        assert os.environ.get("WANDB_MODE") == "offline"
        folder = Path(settings["dir"]) / "wandb" / f"offline-run-{settings['id']}"
        folder.mkdir(parents=True, exist_ok=True)
        runs.append(FakeWandbRun(**settings))
        return runs[-1]

    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # as find_spec expects of an imported one
    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return runs


@pytest.mark.parametrize("trainer", TRAINERS)
def test_every_trainer_takes_report_to(trainer: str, capsys: pytest.CaptureFixture[str]) -> None:
    if trainer == "sb3":
        pytest.importorskip("stable_baselines3")
    extra = ["--algo", "ppo"] if trainer == "sb3" else []
    for value in ("tensorboard", "wandb", "none"):
        args = build_parser().parse_args(["train", trainer, *extra, "--report-to", value])
        assert args.report_to == value
    with pytest.raises(SystemExit, match="2"):
        build_parser().parse_args(["train", trainer, *extra, "--report-to", "mlflow"])
    assert "invalid choice: 'mlflow'" in capsys.readouterr().err
    assert build_parser().parse_args(["train", trainer, *extra]).report_to == "tensorboard"


@pytest.mark.parametrize("trainer", TRAINERS)
def test_wandb_missing_is_one_line_naming_the_extra_and_writes_nothing(
    trainer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if trainer == "sb3":
        pytest.importorskip("stable_baselines3")
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed, whether it is or not
    run = tmp_path / "run"
    extra = ["--algo", "a2c"] if trainer == "sb3" else []
    assert main(["train", trainer, *extra, "--run-dir", str(run), "--report-to", "wandb"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "searchgym: error: --report-to wandb needs the optional package 'wandb'. "
        f"Install it with: {install_command('wandb')}"
    ]
    assert not run.exists()


def test_the_install_advice_is_doctors_and_names_what_the_index_has(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import searchgym.errors
    from searchgym.app.doctor import checks as _doctor

    # From this checkout: the same command as doctor's line for the extra, the checkout's constraints pinned.
    advice = str(MissingDependencyError("wandb", "wandb", "--report-to wandb"))
    assert advice.endswith("Install it with: pip install -c constraints.txt -e '.[wandb]'")
    monkeypatch.setattr(_doctor, "installed_version", lambda name: None)  # no extra installed
    assert main(["doctor"]) in (0, 1)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("skip  extra wandb"))
    assert line.endswith(f"to enable: {install_command('wandb')}"), line
    # From a wheel: the extra's own requirement, which the package index has (searchgym itself it has not).
    monkeypatch.setattr(searchgym.errors, "checkout_root", lambda: None)
    advice = str(MissingDependencyError("wandb", "wandb", "--report-to wandb"))
    assert advice.endswith("Install it with: pip install 'wandb>=0.16'"), advice
    assert install_command("verl").endswith("in a separate virtualenv (verl pins transformers < 5.11)")


def test_the_wandb_extra_is_declared() -> None:
    import configparser

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).parents[3] / "setup.cfg")
    assert setup["options.extras_require"]["wandb"].split() == ["wandb>=0.16"]


def test_real_wandb_is_optional() -> None:
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed (extra searchgym[wandb]); the stand-in module tests its path")
    import wandb

    assert callable(wandb.init)


def test_report_to_none_and_no_tensorboard_write_no_events(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    for name, config in {
        "default": SFTConfig(),
        "none": SFTConfig(report_to="none"),
        "no-tensorboard": SFTConfig(tensorboard=False),
    }.items():
        logger = MetricLogger(tmp_path / name, config=config)
        logger.log(1, {"train/loss": 0.5})
        logger.close()
        assert read_metrics(tmp_path / name) == [{"step": 1, "train/loss": 0.5}]
        events = list((tmp_path / name).glob("tb/events.*"))
        assert bool(events) == (name == "default"), name


def test_wandb_receives_every_logged_step_and_a_resumed_run_continues_it(
    tmp_path: Path, fake_wandb: list[FakeWandbRun]
) -> None:
    config = SFTConfig(run_dir=str(tmp_path / "run"), report_to="wandb", tensorboard=False)
    logger = MetricLogger(config.run.run_dir, config=config)
    logger.log(1, {"train/loss": 2.0, "rollout/em": float("nan")})
    logger.log(2, {"train/loss": 1.5})
    logger.close()
    [run] = fake_wandb
    assert run.finished and run.logged == [(1, {"train/loss": 2.0}), (2, {"train/loss": 1.5})]
    assert run.settings["project"] == "searchgym" and run.settings["name"] == "run"
    assert run.settings["dir"] == config.run.run_dir and run.settings["config"]["lr"] == config.optim.lr
    assert (Path(config.run.run_dir) / "wandb" / f"offline-run-{run.settings['id']}").is_dir()
    assert (Path(config.run.run_dir) / WANDB_RUN_ID).read_text().strip() == run.settings["id"]
    assert not (Path(config.run.run_dir) / "tb").exists()  # wandb replaces the TensorBoard default

    resumed = MetricLogger(config.run.run_dir, resume_step=1, config=config)
    resumed.log(2, {"train/loss": 1.25})
    resumed.close()
    assert fake_wandb[1].settings["id"] == run.settings["id"]  # the same W&B run goes on
    assert fake_wandb[1].settings["resume"] == "allow"
    fresh = MetricLogger(tmp_path / "other", config=config)
    fresh.close()
    assert fake_wandb[2].settings["id"] != run.settings["id"]


def test_train_sft_reports_to_wandb(
    tmp_path: Path, fake_wandb: list[FakeWandbRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("WANDB_PROJECT", "sg-test")
    run = tmp_path / "sft"
    argv = ["train", "sft", "--run-dir", str(run), "--report-to", "wandb", "--demo-episodes", "4", "--epochs", "1",
            "--batch-size", "2", "--eval-questions", "0", "--tiny-layers", "1", "--threads", "1", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    [wandb_run] = fake_wandb
    assert wandb_run.settings["project"] == "sg-test" and wandb_run.finished
    logged = [
        (r["step"], {k: v for k, v in r.items() if k != "step" and v is not None}) for r in read_metrics(run)
    ]
    assert logged and wandb_run.logged == logged  # every line of metrics.jsonl, at its step
    assert wandb_run.settings["config"]["report_to"] == "wandb"
    assert not (run / "tb").exists()


def test_train_sb3_reports_its_logger_rows_to_wandb(
    tmp_path: Path, fake_wandb: list[FakeWandbRun], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("stable_baselines3")
    from searchgym.envs import EnvSpec

    run = tmp_path / "sb3"
    argv = ["train", "sb3", "--algo", "a2c", "--steps", "16", "--eval-questions", "0", "--save-every", "0",
            "--run-dir", str(run), "--report-to", "wandb"]  # fmt: skip
    assert main(argv) == 0
    [wandb_run] = fake_wandb
    assert wandb_run.finished and wandb_run.settings["config"]["algo"] == "a2c"
    assert wandb_run.settings["config"]["env"]["topk"] == EnvSpec().topk  # the env's whole record
    import csv

    with open(run / "progress.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(wandb_run.logged) == len(rows)  # one report per row of SB3's logger
    for (step, reported), row in zip(wandb_run.logged, rows, strict=True):
        written = {k: float(v) for k, v in row.items() if v != ""}
        kept_out = {k for k in written if k not in reported}  # what SB3 keeps out of TensorBoard, as we do
        assert kept_out <= {"time/total_timesteps", "train/n_updates", "time/iterations", "time/episodes"}
        assert {k: written[k] for k in reported} == reported and written.get(
            "time/total_timesteps", step
        ) == step
    assert "time/train_seconds" in reported and "rollout/em" in reported
    assert json.loads((run / "config.json").read_text())["report_to"] == "wandb"
    assert not (run / "tb").exists()


def test_wandb_reporter_names_the_extra_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingDependencyError, match=re.escape(install_command("wandb"))):
        SFTConfig(report_to="wandb")
