"""The experiment scripts, every stage, at the tiny size of their ``SMALL=1`` mode.

``SMALL=1`` shrinks budgets only (demonstrations, model, steps, batch, turn length, probes, evaluation
questions; lld_experiment.sh's seeds 0-2 to seed 0), so what is checked is that each stage runs with the
options it passes today and writes what the next stage and the report read; the figures are meaningless
at this size. The stages run in order in one temporary ``OUT`` with the ``searchgym`` and ``python`` of
the virtualenv running the tests. Every training run is its own ``searchgym`` process, and importing torch
and transformers is most of each one's CPU, so the number of runs sets the cost: the ``searchgym`` the
scripts get forks each run from a server that has done those imports once (tests/searchgym_forkserver.py),
still one process per run, in the script's folder, with its environment, streams and exit code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .searchgym_forkserver import forkserver

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGE_TIMEOUT_S = 600  # a hang guard: the machine may be busy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path("/usr/bin/time").is_file(), reason="the scripts time runs with /usr/bin/time"
    ),
]


@pytest.fixture(scope="module", autouse=True)
def searchgym_command() -> Iterator[Path]:
    """The ``searchgym`` the scripts run: forked from one server for the module (see the module doc)."""
    if shutil.which("searchgym", path=str(BIN)) is None:
        pytest.skip(f"no searchgym command in {BIN}")
    with forkserver(BIN / "searchgym") as folder:
        SEARCHGYM["command"] = str(folder / "searchgym")
        yield folder / "searchgym"
    SEARCHGYM["command"] = str(BIN / "searchgym")


SEARCHGYM = {"command": str(BIN / "searchgym")}
"""The ``searchgym`` command :func:`small_env` gives the scripts (set by :func:`searchgym_command`)."""


def run_stage(script: str, args: list[str], env: dict[str, str]) -> str:
    """Runs ``scripts/SCRIPT ARGS``; fails the test with the output's tail on a non-zero exit."""
    if shutil.which("searchgym", path=str(BIN)) is None:
        pytest.skip(f"no searchgym command in {BIN}")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=STAGE_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"{script} {' '.join(args)} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def report(args: list[str], env: dict[str, str] | None = None) -> str:
    """Runs ``scripts/lld_report.py ARGS``; fails the test with the stderr's tail on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lld_report.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=STAGE_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def small_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "SMALL": "1",
        "OUT": str(tmp_path / "runs"),
        "SEARCHGYM": SEARCHGYM["command"],
        "PYTHON": sys.executable,
        "JOBS": "2",
        "MPLBACKEND": "Agg",
        **extra,
    }


def run_files(out: Path, runs: list[str]) -> list[str]:
    """The files a finished GRPO run of the scripts leaves, missing ones only."""
    return [
        f"{run}/{name}"
        for run in runs
        for name in ("checkpoint.pt", "metrics.jsonl", "wall_s")
        if not (out / run / name).is_file()
    ]


def test_the_usage_lists_the_stages() -> None:
    for script, stage in (
        ("lld_experiment.sh", "warmstart"),
        ("lld2_experiment.sh", "warmstart"),
        ("learn_experiment.sh", "gns"),
        ("lld3_experiment.sh", "runs"),
        ("learn2_experiment.sh", "headroom"),
    ):
        done = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True)
        assert done.returncode == 2 and stage in done.stdout and "SMALL=1" in done.stdout


def test_learn_experiment_stages_at_a_tiny_size(tmp_path: Path) -> None:
    """docs/experiments/learn.md's stages: gns, runs (control and two rates, seed 0), summarize, and the
    report with its criteria and figure (``lld_report.py learn``)."""
    summaries = tmp_path / "summaries"
    env = small_env(tmp_path, SUMMARIES=str(summaries))
    out = Path(env["OUT"])
    run_stage("learn_experiment.sh", ["gns"], env)
    gns = json.loads((summaries / "gns_warmstart.json").read_text())
    assert gns["groups"] == 4 and "noise_scale_groups" in gns
    run_stage("learn_experiment.sh", ["runs", "0"], env)
    arms = ("control", "lr1e-4", "lr3e-4")
    assert not run_files(out, [f"{arm}/s0" for arm in arms])
    for arm in arms:  # summarised as each landed, with the test split's sampled reward
        summary = json.loads((summaries / f"{arm}_s0.json").read_text())
        assert summary["steps"] == 2 and summary["sampled_test"]["split"] == "test"
        assert summary["config"]["lr"] == {"control": 0.0, "lr1e-4": 1e-4, "lr3e-4": 3e-4}[arm]
    control = json.loads((summaries / "control_s0.json").read_text())
    assert len({e["em_by_question"] for e in control["eval"].values()}) == 1, "frozen weights, same answers"
    run_stage("learn_experiment.sh", ["summarize"], env)
    stdout = report(["learn", str(summaries), "--plots", str(tmp_path)], env)
    assert "lr1e-4: L1" in stdout and "L2" in stdout and "L3" in stdout
    assert (tmp_path / "learn_curves.png").stat().st_size > 10_000


def test_lld_experiment_stages_at_a_tiny_size(tmp_path: Path) -> None:
    """docs/experiments/lld.md's stages: warmstart, calibrate, main, secondary, report (with plots)."""
    env = small_env(tmp_path, LR="7e-4", PLOTS=str(tmp_path / "plots"))
    out = Path(env["OUT"])
    run_stage("lld_experiment.sh", ["warmstart"], env)
    assert (out / "demos.jsonl").stat().st_size > 0 and (out / "sft" / "checkpoint.pt").is_file()
    run_stage("lld_experiment.sh", ["calibrate"], env)
    assert not run_files(out, [f"grpo_lr{lr}/s0" for lr in ("5e-4", "7e-4", "1e-3")])
    log = run_stage("lld_experiment.sh", ["main"], env)
    assert "skip" in log  # grpo_lr7e-4/s0 is stage A's run: reused, not run again
    assert not run_files(out, [f"{arm}_lr7e-4/s0" for arm in ("grpo", "llds", "lldsma")])
    run_stage("lld_experiment.sh", ["secondary"], env)
    assert not run_files(out, ["llds05_lr7e-4/s0"])
    report = run_stage("lld_experiment.sh", ["report"], env)
    assert "verdict at lr 7e-4" in report and "reproduced:" in report
    # Stage A's figure; stage B's need two seeds per arm, which SMALL=1 does not run.
    assert (tmp_path / "plots" / "lld_stage_a.png").stat().st_size > 10_000


def test_lld2_experiment_stages_at_a_tiny_size(tmp_path: Path) -> None:
    """docs/experiments/lld2.md's stages: warmstart, gate, extend, runs (arms A-D, seed 0), summarize, and
    the report the summaries feed (``lld_report.py lld2``)."""
    summaries = tmp_path / "summaries"
    env = small_env(tmp_path, SUMMARIES=str(summaries))
    out = Path(env["OUT"])
    run_stage("lld2_experiment.sh", ["warmstart"], env)
    assert (out / "sft" / "checkpoint.pt").is_file()
    run_stage("lld2_experiment.sh", ["gate"], env)
    gate = json.loads((summaries / "gate_sft.json").read_text())
    assert gate["questions"] == 2 and isinstance(gate["passed"], bool)
    run_stage("lld2_experiment.sh", ["extend", "1"], env)
    assert (out / "sft_ext1" / "checkpoint.pt").is_file()
    run_stage("lld2_experiment.sh", ["runs", "0"], env)
    arms = ("A", "B", "C", "D")
    assert not run_files(out, [f"{arm}/s0" for arm in arms])
    # GRPO started from the newest SFT stage, and each finished run was summarized as it landed.
    for arm in arms:
        summary = json.loads((summaries / f"{arm}_s0.json").read_text())
        assert summary["options"]["init"] == str(out / "sft_ext1" / "checkpoint.pt") and summary["steps"] == 2
    run_stage("lld2_experiment.sh", ["summarize"], env)
    stdout = report(["lld2", str(summaries), "--plots", str(tmp_path)], env)
    assert "gate gate_sft" in stdout and "C1 A collapses" in stdout
    assert (tmp_path / "lld2_curves.png").stat().st_size > 10_000


def test_lld3_experiment_stages_at_a_tiny_size(tmp_path: Path) -> None:
    """docs/experiments/lld3.md's stages: the five arms of seed 0, summarised as each lands, and the report
    with its criteria and figure (``lld_report.py lld3``)."""
    summaries = tmp_path / "summaries"
    env = small_env(tmp_path, SUMMARIES=str(summaries))
    run_stage("lld3_experiment.sh", ["runs", "0"], env)
    arms = ("control", "grpo", "llds", "ledger", "sapo")
    assert not run_files(Path(env["OUT"]), [f"{arm}/s0" for arm in arms])
    options = {arm: json.loads((summaries / f"{arm}_s0.json").read_text())["config"] for arm in arms}
    assert options["control"]["lr"] == 0.0 and options["grpo"]["warmup_start_lr"] == 1e-4
    assert (options["grpo"]["llds"], options["llds"]["llds"], options["ledger"]["llds_ledger"]) == (
        "none",
        "action",
        True,
    )
    assert options["sapo"]["sapo_coef"] == 0.2 and options["grpo"]["sapo_coef"] == 0.0
    assert all(o["ledger_size"] == 4 for o in options.values()), "every arm measures the ledger"
    stdout = report(["lld3", str(summaries), "--plots", str(tmp_path)], env)
    assert "C1 learn, then collapse" in stdout and "C3 sapo" in stdout and "C4 the phases" in stdout
    assert (tmp_path / "lld3_curves.png").stat().st_size > 10_000


def test_learn2_experiment_stages_at_a_tiny_size(tmp_path: Path) -> None:
    """docs/experiments/learn2.md's stages: the headroom demonstrations and warm-start, the headroom gate,
    the four arms of seed 0 (summarised as each lands), and the report with its criteria G1-G3."""
    summaries = tmp_path / "summaries"
    env = small_env(tmp_path, SUMMARIES=str(summaries))
    out = Path(env["OUT"])
    run_stage("learn2_experiment.sh", ["warmstart"], env)
    demos = [json.loads(line) for line in (out / "demos_headroom.jsonl").read_text().splitlines()]
    assert len(demos) == 8 and {d["demonstrator"] for d in demos} <= {"oracle", "shortcut"}
    assert (out / "warmstart" / "checkpoint.pt").is_file()
    run_stage("learn2_experiment.sh", ["headroom"], env)
    gate = json.loads((summaries / "headroom_warmstart.json").read_text())
    assert (gate["questions"], gate["samples"], sum(k["questions"] for k in gate["by_kind"].values())) == (
        2,
        2,
        2,
    )
    run_stage("learn2_experiment.sh", ["runs", "0"], env)
    arms = ("control", "grpo", "scst", "sft")
    assert not run_files(out, [f"{arm}/s0" for arm in arms if arm != "sft"])
    options = {arm: json.loads((summaries / f"{arm}_s0.json").read_text())["config"] for arm in arms}
    assert (options["control"]["lr"], options["grpo"]["advantage"], options["scst"]["advantage"]) == (
        0.0,
        "group",
        "greedy",
    )
    assert options["sft"]["keep_unrewarded"] is True and options["sft"]["lr"] == 3e-4
    stdout = report(["learn2", str(summaries)], env)
    assert "control s0: greedy test EM by step" in stdout and "scst: G1" in stdout and "G3" in stdout


def test_learn2_rebuilds_its_warm_start_with_the_recipe(tmp_path: Path) -> None:
    """``RECIPE=1``: the warm-start stage is ``searchgym warmstart --recipe headroom`` (no cached file), whose
    demonstrations feed the continued-SFT arm, and every later stage plays the recipe's one passage per
    search."""
    summaries = tmp_path / "summaries"
    env = small_env(tmp_path, SUMMARIES=str(summaries), RECIPE="1")
    out = Path(env["OUT"])
    run_stage("learn2_experiment.sh", ["warmstart"], env)
    card = json.loads((out / "warmstart" / "card.json").read_text())
    assert card["recipe"] == "headroom" and card["options"]["topk"] == 1
    assert (out / "demos_headroom.jsonl").read_text() == (out / "warmstart" / "demos.jsonl").read_text()
    run_stage("learn2_experiment.sh", ["lever", "grpo_recipe", "0", "group"], env)
    manifest = json.loads((out / "grpo_recipe" / "s0" / "manifest.json").read_text())
    assert manifest["config"]["init"] == str(out / "warmstart" / "checkpoint.pt")
    assert manifest["episode"]["topk"] == 1


def test_the_warmstart_page_quotes_its_frontier(tmp_path: Path) -> None:
    """docs/experiments/warmstart.md's frontier table is what scripts/warmstart_frontier.py prints from the
    points committed beside it, and the script draws the figure; an empty folder is one error line."""
    script = ROOT / "scripts" / "warmstart_frontier.py"
    folder = ROOT / "docs" / "experiments" / "warmstart"
    done = subprocess.run(
        [sys.executable, str(script), str(folder), "--plot", str(tmp_path / "f.png")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    printed = done.stdout.split("\nwrote ")[0].strip()
    doc = (ROOT / "docs" / "experiments" / "warmstart.md").read_text()
    start = "<!-- frontier: python scripts/warmstart_frontier.py docs/experiments/warmstart -->"
    quoted = doc.split(start)[1].split("<!-- /frontier -->")[0].strip()
    assert quoted == printed
    assert len(printed.splitlines()) == 2 + len(list(folder.glob("e*.json")))
    assert (tmp_path / "f.png").stat().st_size > 10_000
    empty = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, cwd=tmp_path
    )
    assert empty.returncode == 1 and "no frontier points" in empty.stderr


@pytest.mark.parametrize("study", ["learn", "lld3", "learn2"])
def test_the_study_page_quotes_the_report_of_the_committed_summaries(study: str) -> None:
    """docs/experiments/STUDY.md's tables and verdict are what ``lld_report.py STUDY`` prints from the
    summaries committed beside it: no figure in the page that the runs did not give."""
    doc = (ROOT / "docs" / "experiments" / f"{study}.md").read_text()
    start, end = (
        f"<!-- report: python scripts/lld_report.py {study} docs/experiments/{study} -->",
        "<!-- /report -->",
    )
    assert start in doc and end in doc
    quoted = doc.split(start)[1].split(end)[0].strip().removeprefix("```text").removesuffix("```").strip()
    assert quoted == report([study, str(ROOT / "docs" / "experiments" / study)]).strip()


def test_lld5_dial_levels_at_a_tiny_size(tmp_path: Path) -> None:
    """docs/experiments/lld5.md's dial levels: one short run per level, and a table of the gap each opened
    (the bfloat16 sampler and the noisy one open a gap on the first step; a sampler one update stale does
    once the learner has moved)."""
    env = small_env(tmp_path, LEVELS="bf16:--sampler-dtype=bfloat16 noise1:--sampler-noise=1.0")
    stdout = run_stage("lld5_dial_levels.sh", [], env)
    rows = [line for line in stdout.splitlines() if line.startswith("| bf16") or line.startswith("| noise1")]
    assert len(rows) == 2, stdout
    kl = {row.split("|")[1].strip(): float(row.split("|")[3]) for row in rows}
    assert kl["noise1"] > 0 and kl["bf16"] >= 0
