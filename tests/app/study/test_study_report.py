"""A study's report: each definition kind and criterion on hand-built summaries, and the committed LLD-3 and
learning studies re-reported from their protocols with the verdicts their own report scripts print."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.cli import main
from searchgym.app.study.criteria import count_word
from searchgym.app.study.protocol import load_protocol
from searchgym.app.study.report import Judge, report
from searchgym.app.study.summary import load_summaries

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS = ROOT / "docs" / "experiments"


def summary(
    arm: str, seed: int, reward: list[float], evals: dict[int, str] | None = None, **curves: list[Any]
) -> dict[str, Any]:
    """A hand-built run summary: ``reward`` is ``rollout/sampled_reward`` at steps 1, 2, …; ``evals`` maps a
    step to its per-question EM (a string of 0/1); ``curves`` adds other metrics."""
    steps = list(range(1, len(reward) + 1))
    return {
        "arm": arm,
        "seed": seed,
        "commit": None,
        "config": {},
        "steps": len(steps),
        "wall_s": 60.0,
        "curves": {"step": steps, "rollout/sampled_reward": reward} | curves,
        "probe_step0": {"lld/probe_onpolicy_heldout": -1.0},
        "eval": {
            str(t): {"em": ems.count("1") / len(ems), "questions": f"q ({len(ems)})", "em_by_question": ems}
            for t, ems in (evals or {}).items()
        },
        "sampled_test": None,
    }


def write(folder: Path, summaries: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for s in summaries:
        (folder / f"{s['arm']}_s{s['seed']}.json").write_text(json.dumps(s))
    return folder


def test_count_words() -> None:
    assert count_word(2, 2, 3, at_least=2) == "MET"
    assert count_word(1, 2, 3, at_least=2) == "undecided (seeds missing)"
    assert count_word(0, 2, 3, at_least=2) == "NOT MET"
    assert count_word(1, 3, 3, at_most=1) == "MET"
    assert count_word(1, 2, 3, at_most=1) == "undecided (seeds missing)"
    assert count_word(2, 2, 3, at_most=1) == "NOT MET"


# The tiny protocol's definitions: learned = mean d over steps 1-2 >= 0 with its interval above 0; collapse =
# the first step whose d is at or below -0.5. Over four steps instead of two here, the same definitions:
PROTOCOL_4 = {"steps = 2": "steps = 4", "steps = [0, 1, 2]": "steps = [0, 2, 4]"}


def four_step_protocol(write_protocol: Callable[..., Path], extra: str = "") -> Path:
    path = write_protocol()
    text = path.read_text()
    for a, b in PROTOCOL_4.items():
        text = text.replace(a, b)
    path.write_text(text + extra)
    return path


SIGNAL_P = """
[signals.P]
kind = "drawdown"
metric = "lld/probe_onpolicy_heldout"
drop = 0.05
"""
"""The held-out probe's drawdown: the signal of the lead tests."""

PROBE_TURNS_AT_2 = {"lld/probe_onpolicy_heldout": [-1.0, -1.1, -1.2, -1.3]}
"""A probe 0.05 or more below its best from step 2 on."""

LEARNS_THEN_COLLAPSES = {0: "1100", 2: "1110", 4: "1000"}
"""Per-question greedy EM at steps 0, 2, 4 of a grpo run that learns, then collapses at step 3."""

CONTROL_EVALS = {0: "1100", 2: "1100", 4: "1100"}


def lead_criterion(cid: str, lead: int, *, name: str = "", min_events: int | None = None) -> str:
    """A ``lead`` criterion on grpo's collapse by signal P."""
    return "\n".join(
        [
            "[[criteria]]",
            f'id = "{cid}"',
            *([f'name = "{name}"'] if name else []),
            'kind = "lead"',
            'arms = ["grpo"]',
            'event = "collapse"',
            'signals = ["P"]',
            f"lead = {lead}",
            *([f"min_events = {min_events}"] if min_events is not None else []),
            "",
        ]
    )


def test_the_verdict_on_hand_built_summaries(tmp_path: Path, write_protocol: Callable[..., Path]) -> None:
    """Two seeds of a grpo arm that learns (d = +0.2, +0.3 over steps 1-2) then collapses (d = -0.6 at step
    3): C1 met in both; a probe turning at step 2 leads the collapse by 1, a lead criterion asking 1 is met,
    asking 2 is not; the report's tables show the collapse step and the probe's onset and lead."""
    lead = SIGNAL_P + lead_criterion("C2", 1, name="a precursor") + lead_criterion("C2b", 2)
    path = four_step_protocol(write_protocol, lead)
    write(
        tmp_path / "summaries",
        [
            *(summary("control", s, [0.5] * 4, evals=CONTROL_EVALS) for s in (0, 1)),
            *(
                summary("grpo", s, [0.7, 0.8, -0.1, 0.0], evals=LEARNS_THEN_COLLAPSES, **PROBE_TURNS_AT_2)
                for s in (0, 1)
            ),
        ],
    )
    protocol = load_protocol(path)
    text = report(protocol)
    verdict = [line.strip() for line in text.split("verdict:\n")[1].splitlines()]
    assert verdict[0].startswith("C1 learn, then collapse — grpo: MET (learned and collapse in seeds [0, 1]")
    assert verdict[1].startswith("C2 a precursor — grpo: MET (by P;")
    assert verdict[2].startswith("C2b grpo: NOT MET") and "P [1, 1]" in verdict[2]
    runs = [line for line in text.splitlines() if line.startswith("| grpo | 0 |")]
    assert runs[0].startswith("| grpo | 0 | +0.250 [") and "| 3 |" in runs[0]  # learned, then collapse at 3
    assert "0.500 0.750 0.250" in runs[0]  # greedy EM at 0, 2, 4: the warm-start's from the control
    assert "| grpo | 0 | 3 | 2 (+1) |" in text  # the signals table: collapse at 3, P at 2, lead +1
    assert "not logged by these runs: ledger, entropy, grad_norm, searches, response_length" in text


def test_a_lead_criterion_waits_for_missing_seeds(
    tmp_path: Path, write_protocol: Callable[..., Path]
) -> None:
    """With seed 1 missing, a lead met in seed 0 is undecided (seed 1 could collapse without it), a lead
    missed in seed 0 is NOT MET already (no seed adds a lead), and a criterion needing two collapses while one
    is in waits too."""
    lead = (
        SIGNAL_P
        + lead_criterion("C2", 1, min_events=1)
        + lead_criterion("C2b", 2, min_events=1)
        + lead_criterion("C2c", 1, min_events=2)
    )
    path = four_step_protocol(write_protocol, lead)
    write(
        tmp_path / "summaries",
        [
            summary("control", 0, [0.5] * 4, evals=CONTROL_EVALS),
            summary("grpo", 0, [0.7, 0.8, -0.1, 0.0], evals=LEARNS_THEN_COLLAPSES, **PROBE_TURNS_AT_2),
        ],
    )
    verdict = report(load_protocol(path)).split("verdict:\n")[1]
    lines = {line.split()[0]: line for line in verdict.strip().splitlines()}
    assert "grpo: undecided (seeds missing) (by P;" in lines["C2"]
    assert "grpo: NOT MET" in lines["C2b"] and "P [1]" in lines["C2b"]
    assert "grpo: undecided (seeds missing) (collapse in 1 seed(s) [0], 2 needed)" in lines["C2c"]


def test_criteria_wait_for_missing_seeds(tmp_path: Path, write_protocol: Callable[..., Path]) -> None:
    path = four_step_protocol(write_protocol)
    write(
        tmp_path / "summaries",
        [summary("control", 0, [0.5] * 4), summary("grpo", 0, [0.7, 0.8, -0.1, 0.0])],
    )
    text = report(load_protocol(path))
    assert "missing: control s1, grpo s1" in text
    assert "C1 learn, then collapse — grpo: undecided (seeds missing)" in text


def test_no_summaries_is_one_line(
    write_protocol: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["study", "report", str(write_protocol())]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no summaries of tiny's arms" in err and "study run" in err


def test_definition_kinds_of_greedy_em(tmp_path: Path, write_protocol: Callable[..., Path]) -> None:
    """The kinds a study judged on greedy EM uses: a rise and fall around the peak, a gain over another arm
    with its paired interval, an EM drawdown as an event; and a pooled gain over the warm-start."""
    extra = """
[arms.cure]
lr = 1e-3
llds = "action"

[definitions.rise_fall]
kind = "peak"
rise_at_least = 0.25
fall_at_least = 0.25

[definitions.keeps_half]
kind = "peak"
keeps_at_least = 0.5

[definitions.beats_grpo]
kind = "em_gain"
against = "grpo"
at_least = 0.25
interval = true

[definitions.em_fall]
kind = "drawdown"
metric = "eval/em"
drop = 0.25

[[criteria]]
id = "D1"
kind = "seeds"
arms = ["grpo"]
when = ["rise_fall"]
at_least = 2

[[criteria]]
id = "D2"
kind = "seeds"
arms = ["cure"]
when = ["beats_grpo", "keeps_half"]
at_least = 2

[[criteria]]
id = "L2"
kind = "pooled_em_gain"
arms = ["cure"]
at_least = 0.25
resamples = 1000
"""
    path = four_step_protocol(write_protocol, extra)
    n = 40
    warm, top, low = "1" * 10 + "0" * 30, "1" * 30 + "0" * 10, "0" * n
    good = "1" * 25 + "0" * 15
    write(
        tmp_path / "summaries",
        [
            *(summary("control", s, [0.5] * 4, evals={0: warm, 2: warm, 4: warm}) for s in (0, 1)),
            *(summary("grpo", s, [0.5] * 4, evals={2: top, 4: low}) for s in (0, 1)),
            *(summary("cure", s, [0.5] * 4, evals={2: top, 4: good}) for s in (0, 1)),
        ],
    )
    protocol = load_protocol(path)
    judge = Judge(protocol, load_summaries(tmp_path / "summaries"))
    grpo, cure = judge.view("grpo", 0), judge.view("cure", 0)
    assert grpo is not None and cure is not None
    assert grpo.find("rise_fall").values == {"start": 0.25, "peak": 0.75, "end": 0.0}
    assert grpo.find("rise_fall").met and not cure.find("rise_fall").met
    assert grpo.find("em_fall").step == 4 and cure.find("em_fall").step is None  # 0.75 -> 0.0; -> 0.625
    assert cure.find("keeps_half").met and not grpo.find("keeps_half").met  # 0.375 of 0.5 kept; none
    gain = cure.find("beats_grpo")
    assert gain.met and gain.values["gain"] == pytest.approx(0.625) and gain.values["lo"] > 0.25
    words = {v.id: v.word for v in judge.verdicts() if v.id != "C1"}
    assert words == {"D1": "MET", "D2": "MET", "L2": "MET"}  # pooled: 0.625 - 0.25 = +0.375 >= 0.25


def test_an_arm_that_falls_earlier_or_ends_below_another(
    tmp_path: Path, write_protocol: Callable[..., Path]
) -> None:
    """LLD-5's L3 kinds: ``earlier`` (the event at least ``by`` steps before another arm's, or where the other's
    never comes), ``em_gain`` with ``at_most`` (ends below another arm, its paired interval below 0), and
    ``either`` (any of them); the report counts the questions lost between peak and end by kind and stage."""
    extra = """
[arms.mismatch]
lr = 1e-3
llds = "none"

[definitions.em_fall]
kind = "drawdown"
metric = "eval/em"
drop = 0.1

[definitions.falls_earlier]
kind = "earlier"
event = "em_fall"
against = "grpo"
by = 2

[definitions.ends_below]
kind = "em_gain"
against = "grpo"
at_most = -0.05
interval = true

[definitions.hurts]
kind = "either"
of = ["falls_earlier", "ends_below"]

[[criteria]]
id = "L3"
kind = "seeds"
arms = ["mismatch"]
when = ["hurts"]
at_least = 2

[report]
event = "em_fall"
losses = ["grpo"]
"""
    path = four_step_protocol(write_protocol, extra)
    warm, top, low = "1" * 10 + "0" * 30, "1" * 30 + "0" * 10, "1" * 5 + "0" * 35
    mid = "1" * 22 + "0" * 18
    grpo_end = summary("grpo", 0, [0.5] * 4, evals={2: top, 4: low})
    # the end's records: the 25 lost questions are bridge questions failing retrieval, the rest misread
    grpo_end["eval"]["4"] |= {
        "stage_by_question": "c" * 5 + "r" * 25 + "m" * 10,
        "kind_by_question": "b" * 40,
    }
    write(
        tmp_path / "summaries",
        [
            *(summary("control", s, [0.5] * 4, evals={0: warm, 2: warm, 4: warm}) for s in (0, 1)),
            grpo_end,
            summary("grpo", 1, [0.5] * 4, evals={2: top, 4: top}),  # never falls
            summary("mismatch", 0, [0.5] * 4, evals={2: low, 4: low}),  # falls at 2, grpo at 4
            summary("mismatch", 1, [0.5] * 4, evals={2: mid, 4: mid}),  # no fall, ends 0.2 below grpo
        ],
    )
    judge = Judge(load_protocol(path), load_summaries(tmp_path / "summaries"))
    m0, m1 = judge.view("mismatch", 0), judge.view("mismatch", 1)
    assert m0 is not None and m1 is not None
    assert m0.find("falls_earlier").met and m0.find("falls_earlier").values == {"lead": 2.0}
    assert not m1.find("falls_earlier").met
    below = m1.find("ends_below")
    assert below.met and below.values["gain"] == pytest.approx(-0.2) and below.values["hi"] < 0
    assert m0.find("hurts").met and m1.find("hurts").met
    assert [v.word for v in judge.verdicts() if v.id == "L3"] == ["MET"]
    text = report(load_protocol(path), tmp_path / "summaries")
    assert "| s0 | 2 → 4 | 25 / 0 | 0 | 25 | 0 | 0 | 0 | 25 | 0 |" in text
    assert "| s1 | no fall, or no per-question records |" in text


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        ('kind = "earlier"\nevent = "collapse"\nagainst = "nope"', "against must be an arm"),
        ('kind = "earlier"\nevent = "learned"\nagainst = "grpo"', "must be an event kind"),
        ('kind = "either"\nof = ["collapse"]', "must be a test"),
        ('kind = "em_gain"\nat_least = 0.1\nat_most = 0.2', "exactly one of above, at_least and at_most"),
    ],
)
def test_a_malformed_l3_definition_is_one_line(
    tmp_path: Path, write_protocol: Callable[..., Path], definition: str, message: str
) -> None:
    from searchgym.errors import ConfigError

    path = write_protocol()
    path.write_text(path.read_text() + f"\n[definitions.x]\n{definition}\n")
    with pytest.raises(ConfigError, match=message):
        load_protocol(path)


def test_the_figure_is_drawn(tmp_path: Path, write_protocol: Callable[..., Path]) -> None:
    path = four_step_protocol(write_protocol)
    probe = {"lld/probe_onpolicy_heldout": [-1.0, -1.1, -1.2, -1.3], "train/entropy": [0.3, 0.3, 0.4, 0.5]}
    write(
        tmp_path / "summaries",
        [
            *(summary("control", s, [0.5] * 4, evals={0: "10", 4: "10"}, **probe) for s in (0, 1)),
            *(summary("grpo", s, [0.7, 0.8, -0.1, 0.0], evals={4: "11"}, **probe) for s in (0, 1)),
        ],
    )
    figure = tmp_path / "figure" / "tiny.png"
    assert main(["study", "report", str(path), "--figure", str(figure)]) == 0
    assert figure.stat().st_size > 10_000


# -- the committed studies, re-reported -----------------------------------------------------------------


def study_report(protocol: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["study", "report", str(protocol), "--no-figure"]) == 0
    return capsys.readouterr().out


@pytest.fixture
def scripts() -> Any:
    from searchgym.app.study.experiments import lld3

    return lld3


def test_lld3_re_reported_from_its_protocol_gives_lld3_mds_verdict(
    scripts: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``searchgym study report docs/experiments/lld3.toml`` on the committed summaries: C1-C4 say what
    ``python scripts/lld_report.py lld3 docs/experiments/lld3`` says (C3 per cure), with the same collapse
    steps, precursor onsets and leads."""
    folder = EXPERIMENTS / "lld3"
    expected = {}
    for line in scripts.verdict(scripts.seed_rows(scripts.learn_report.load(folder))):
        m = re.match(r"(C\d) (.*?): (MET|NOT MET|undecided|not applicable)", line)
        assert m, line
        arm = m.group(2) if m.group(2) in scripts.CURES else None
        expected[(m.group(1), arm)] = m.group(3)
    assert expected[("C1", None)] == "MET" and expected[("C3", "sapo")] == "NOT MET"  # lld3.md's verdict
    out = study_report(EXPERIMENTS / "lld3.toml", capsys)
    got = {}
    for line in out.split("verdict:\n")[1].splitlines():
        m = re.match(r"  (C\d) [^—]*— (\S+): (MET|NOT MET|undecided|not applicable)", line)
        assert m, line
        got[(m.group(1), m.group(2) if m.group(2) in scripts.CURES else None)] = m.group(3)
    assert got == expected
    leads = re.compile(r"P \[[^\]]*\], R \[[^\]]*\]")
    script_c2 = next(
        x for x in scripts.verdict(scripts.seed_rows(scripts.learn_report.load(folder))) if x.startswith("C2")
    )
    assert leads.search(script_c2).group(0) in out  # type: ignore[union-attr]
    rows = scripts.seed_rows(scripts.learn_report.load(folder))
    judge = Judge(load_protocol(EXPERIMENTS / "lld3.toml"), load_summaries(folder))
    for arm, by_seed in rows.items():
        for seed, row in by_seed.items():
            view = judge.view(arm, seed)
            assert view is not None
            assert view.find("collapse").step == row["collapse"]
            assert (view.find("P").step, view.find("R").step) == (row["P"], row["R"])
            assert view.find("learned").met == row["learned"]["met"]
            assert view.find("behaviour").step == row["behaviour"]


def test_learn_re_reported_from_its_protocol_gives_learn_mds_verdict(
    scripts: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``searchgym study report docs/experiments/learn.toml``: L1-L3 per arm as ``lld_report.py learn``."""
    learn_report = scripts.learn_report
    expected = {}
    for line in learn_report.report(EXPERIMENTS / "learn").split("verdict:\n")[1].splitlines():
        arm, _, rest = line.strip().partition(": ")
        for m in re.finditer(r"(L\d) (MET|NOT MET|undecided)", rest):
            expected[(m.group(1), arm)] = m.group(2)
    assert len(expected) == 6
    out = study_report(EXPERIMENTS / "learn.toml", capsys)
    got = {}
    for line in out.split("verdict:\n")[1].splitlines():
        m = re.match(r"  (L\d) [^—]*— (\S+): (MET|NOT MET|undecided)", line)
        assert m, line
        got[(m.group(1), m.group(2))] = m.group(3)
    assert got == expected


@pytest.mark.parametrize(
    ("page", "study"),
    [(ROOT / "docs" / "study.md", "lld3"), (EXPERIMENTS / "lld4.md", "lld4")],
)
def test_the_verdict_a_page_quotes_is_what_the_report_prints(
    page: Path, study: str, capsys: pytest.CaptureFixture[str]
) -> None:
    quoted = page.read_text().split("```text\nverdict:\n", 1)[1].split("```", 1)[0].strip()
    out = study_report(EXPERIMENTS / f"{study}.toml", capsys)
    assert quoted == out.split("verdict:\n", 1)[1].strip()


def test_lld4_md_quotes_every_table_row_the_report_prints(capsys: pytest.CaptureFixture[str]) -> None:
    page = (EXPERIMENTS / "lld4.md").read_text()
    rows = [
        line for line in study_report(EXPERIMENTS / "lld4.toml", capsys).splitlines() if line.startswith("| ")
    ]
    assert len(rows) >= 2 + 18 + 2 + 15  # both tables' headers, every run, every trained run's signals
    assert [row for row in rows if row not in page] == []


@pytest.mark.parametrize(("study", "arm"), [("lld3", "grpo"), ("learn", "lr1e-4"), ("lld4", "grpo")])
def test_the_protocols_options_are_those_the_committed_runs_recorded(study: str, arm: str) -> None:
    """Every option the committed summaries record (learning rate, ramp, sizes, LLDS, SAPO, ledger, probes,
    evaluation …) is the one the protocol gives their arm: the protocol describes the runs that were made."""
    from searchgym.app.study.runner import check_summaries

    protocol = load_protocol(EXPERIMENTS / f"{study}.toml")
    check_summaries(protocol, protocol.summaries_dir)
    recorded = load_summaries(protocol.summaries_dir)[arm][0]["config"]
    assert {"lr", "questions_per_step", "minibatch_size", "probe_every", "llds", "kl_coef"} <= set(recorded)


def test_lld5_md_quotes_the_report_of_its_committed_summaries(capsys: pytest.CaptureFixture[str]) -> None:
    """lld5.md's part 2 quotes ``searchgym study report docs/experiments/lld5.toml`` whole, on the summaries
    committed beside it (the folder's absolute path aside): a summary committed without its report, or a
    report edited by hand, fails here."""
    page = (EXPERIMENTS / "lld5.md").read_text()
    quoted = page.split("```text\nstudy lld5: ", 1)[1].split("```", 1)[0]
    out = study_report(EXPERIMENTS / "lld5.toml", capsys).split("study lld5: ", 1)[1]
    where = re.compile(r"summarised in \S+/docs/experiments/lld5")
    assert (
        where.sub("summarised in docs/experiments/lld5", quoted).strip()
        == where.sub("summarised in docs/experiments/lld5", out).strip()
    )
