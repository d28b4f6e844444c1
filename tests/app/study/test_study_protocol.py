"""Reading a study protocol: what it turns into, and every malformed file as one clear line from the CLI."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from searchgym.app.cli import main
from searchgym.app.study.protocol import load_protocol
from searchgym.app.study.runner import command


def test_the_tiny_protocol_reads_into_arms_options_and_runs(write_protocol: Callable[..., Path]) -> None:
    p = load_protocol(write_protocol())
    assert p.name == "tiny" and p.seeds == (0, 1) and p.control == "control" and p.steps == 2
    assert p.runs() == [("control", 0), ("grpo", 0), ("control", 1), ("grpo", 1)]  # seed-major
    assert p.runs_dir == p.path.parent / "runs" and p.warmstart == p.path.parent / "warm" / "checkpoint.pt"
    grpo, control = p.options("grpo"), p.options("control")
    assert grpo["lr"] == 1e-3 and control["lr"] == 0.0 and grpo["max_turn_tokens"] == 8
    assert grpo["threads"] == 1 and grpo["progress"] is False and grpo["tensorboard"] is False
    # evaluation points 0, 1, 2: every step, and the warm-start (step 0)
    assert (grpo["eval_every"], grpo["eval_questions"], grpo["eval_batch"]) == (1, 2, 2)
    assert grpo["eval_at_start"] is True
    # the report watches the default signals on metrics the protocol's own signals do not
    assert set(p.report_signals()) == {
        "probe",
        "ledger",
        "entropy",
        "grad_norm",
        "searches",
        "response_length",
    }
    assert p.lead_event() == "collapse"


def test_a_scoring_path_in_train_reaches_every_arms_command(write_protocol: Callable[..., Path]) -> None:
    path = write_protocol()
    path.write_text(path.read_text().replace("[train]\n", "[train]\nshared_prefix = true\n"))
    p = load_protocol(path)
    for arm in ("grpo", "control"):
        assert p.options(arm)["shared_prefix"] is True
        assert "--shared-prefix" in command(p, arm, 0, p.runs_dir / arm / "s0", resume=False)


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Runs the CLI; it must fail with exit 2 and exactly one line on stderr, which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("searchgym: error: ")
    return err


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda t: t.replace("lr = 1e-3", "lrr = 1e-3"),
            r"\[arms.grpo\]: unknown option 'lrr'.*did you mean 'lr'",
        ),
        (
            lambda t: t.replace("[train]\n", "[train]\nquestions_per_stp = 3\n"),
            r"unknown option 'questions_per_stp'",
        ),
        (lambda t: t.replace("[train]\n", "[train]\nseed = 3\n"), r"'seed' is set by the study"),
        (
            lambda t: t.replace("lr = 1e-3", "lr = 1e-3\nshared_prefix = true"),
            r"\[arms.grpo\] shared_prefix: a scoring path is the study's, not an arm's",
        ),
        (lambda t: t.replace("group_size = 2", 'group_size = "two"'), r"\[train\] group_size: expected int"),
        (
            lambda t: t.replace("group_size = 2", "group_size = 1"),
            r"\[arms.control\]: group_size must be >= 2",
        ),
        (lambda t: t.replace('llds = "none"', 'llds = "sometimes"', 1), r"llds: expected one of \['none'"),
        (
            lambda t: t.replace("[warmstart]", "[warm_start]"),
            r"unknown key 'warm_start'; did you mean 'warmstart'",
        ),
        (lambda t: re.sub(r"\[warmstart\]\n[^\[]*", "", t), r"no \[warmstart\] table"),
        (
            lambda t: t.replace('sha256 = "' + "0" * 64 + '"', 'sha256 = "abc"'),
            r"sha256, the checkpoint's digest",
        ),
        (
            lambda t: t.replace("seeds = [0, 1]", "seeds = [0, 0]"),
            r"seeds must be a list of distinct integers",
        ),
        (lambda t: t.replace('control = "control"', 'control = "frozen"'), r"control 'frozen' is not an arm"),
        (lambda t: t.replace("steps = [0, 1, 2]", "steps = [0, 1]"), r"steps end at 1, but the runs train 2"),
        (lambda t: t.replace('kind = "window_gain"', 'kind = "window_gian"'), r"kind must be one of \["),
        (
            lambda t: t.replace("at_most = -0.5", "at_mots = -0.5"),
            r"unknown parameter 'at_mots' of kind 'trailing_below'",
        ),
        (
            lambda t: t.replace('when = ["learned", "collapse"]', 'when = ["learnt"]'),
            r"no definition or signal named 'learnt'",
        ),
        (lambda t: t.replace('arms = ["grpo"]', 'arms = ["gpro"]'), r"criterion C1: no arm named 'gpro'"),
        (lambda t: t + "\n[[criteria]]\nname = 'x'\nkind = 'seeds'\n", r"\[\[criteria\]\] #2: needs an id"),
        (
            lambda t: (
                t + '[definitions.ph]\nkind = "phases"\nevent = "collapse"\nwindows = [[1, 2]]\n'
                'rules = ["train/grad_norm: W2 > W1"]\n'
            ),
            r"\[definitions.ph\]: a rule names W2, but there are 1 windows",
        ),
        (lambda t: t.replace("[study]", "[study\n"), r"not valid TOML"),
    ],
)
def test_a_malformed_protocol_is_one_clear_line(
    write_protocol: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[str], str],
    expected: str,
) -> None:
    path = write_protocol()
    path.write_text(edit(path.read_text()))
    for action in ("report", "status", "run"):
        err = one_line_error(capsys, ["study", action, str(path)])
        assert str(path) in err
        assert re.search(expected, err), err


def test_a_missing_protocol_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, ["study", "status", str(tmp_path / "nowhere.toml")])
    assert "cannot read the protocol" in err and "nowhere.toml" in err


def test_run_checks_the_warm_start_before_any_run(
    tmp_path: Path, write_protocol: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_protocol()
    err = one_line_error(capsys, ["study", "run", str(path)])
    assert "warm-start" in err and "does not exist" in err
    warm = tmp_path / "warm" / "checkpoint.pt"
    warm.parent.mkdir()
    warm.write_bytes(b"not the registered file")
    err = one_line_error(capsys, ["study", "run", str(path)])
    digest = hashlib.sha256(warm.read_bytes()).hexdigest()
    assert f"sha256 {digest[:64]}" in err and "the protocol says " + "0" * 64 in err
    assert not (tmp_path / "runs").exists(), "nothing ran"


CUSTOM_ARM = """
[arms.mine]
lr = 1e-3
llds = "none"
loss_term = "{spec}"
loss_term_coef = 0.1
"""


def test_a_custom_arm_is_a_loss_term(write_protocol: Callable[..., Path]) -> None:
    p = load_protocol(write_protocol(extra_arms=CUSTOM_ARM.format(spec="mypkg.terms:pull")))
    assert p.options("mine")["loss_term"] == "mypkg.terms:pull" and p.options("mine")["loss_term_coef"] == 0.1
    assert "loss_term" not in p.options("grpo")


def test_a_custom_arm_is_checked_before_any_run(
    tmp_path: Path, write_protocol: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_protocol(extra_arms=CUSTOM_ARM.format(spec="mypkg terms"))
    err = one_line_error(capsys, ["study", "report", str(path)])
    assert "[arms.mine]: loss_term must be module:function" in err
    warm = tmp_path / "warm" / "checkpoint.pt"
    warm.parent.mkdir()
    warm.write_bytes(b"a warm-start")
    digest = hashlib.sha256(warm.read_bytes()).hexdigest()
    path = write_protocol(sha256=digest, extra_arms=CUSTOM_ARM.format(spec="no_such_module_xyz:pull"))
    err = one_line_error(capsys, ["study", "run", str(path)])
    assert "cannot import the loss term's module 'no_such_module_xyz'" in err
    assert not (tmp_path / "runs").exists(), "nothing ran"
