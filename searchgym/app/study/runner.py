"""Playing a study's runs, and saying where it stands.

Each run is a ``searchgym train grpo`` subprocess (its own interpreter, one thread) writing into
``RUNS/ARM/sSEED``, ``jobs`` at a time, seed-major. A run's state decides what happens to it:

* **summarised** — its summary is in the summaries folder: never played again (its options are compared
  with the protocol's, and a difference is refused);
* **finished** — its checkpoint holds the last step but no summary was written (killed in between): only
  summarised;
* **partial** — its checkpoint holds an earlier step (killed, or stopped): resumed with ``--resume``, which
  restores the model, optimizer, RNG and ledger and goes on from that step;
* **started** — it wrote files but no checkpoint yet: started again (``--overwrite``);
* **running** — a live process holds its folder's lock: left alone;
* **new** — nothing yet.

A summary is written as each run lands, with the run's wall time (every segment of a resumed run added).

A study writes only into run folders it started: each run folder it starts is marked with ``study.json``
(the study's name, the protocol's path and SHA-256, the arm and the seed), and before any run starts every
folder it would write into must be missing, empty, marked by this study for that run, or a folder an
earlier ``study run`` started before marks were written (its ``command.txt`` is this run's ``train grpo``
command: its run folder, seed and warm-start). Any other folder is refused, named, and nothing is written.
One ``study run`` at a time per runs folder: it holds ``RUNS/study.lock`` (``flock``) for its whole life,
and a second is refused at once, naming the holder.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError

from .folders import COMMAND, MARK, protocol_sha256, refusal, write_mark
from .protocol import Protocol
from .summary import CONFIG_KEYS, CURVES, git_commit, load_summaries, run_summary, summary_path, write_summary

__all__ = [
    "MARK",
    "STUDY_LOCK",
    "RunState",
    "check_run_folders",
    "check_summaries",
    "check_warmstart",
    "run_states",
    "run_study",
    "status",
]

LOG = "log.txt"
WALL = "wall_s"
STUDY_LOCK = "study.lock"
"""The lock a ``study run`` holds in its runs folder."""
FLOAT_TOLERANCE = 1e-12


@dataclass(frozen=True)
class RunState:
    """Where one run of a study stands (see the module's docstring for the states)."""

    arm: str
    seed: int
    state: str
    step: int | None = None
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.arm} s{self.seed}"


def run_dir(protocol: Protocol, arm: str, seed: int, runs: Path | None = None) -> Path:
    return (runs if runs is not None else protocol.runs_dir) / arm / f"s{seed}"


def _live_holder(folder: Path) -> int | None:
    """The process id of a live process that holds the run folder's lock on this host, if any."""
    from searchgym.run_lock import LOCK_NAME

    try:
        record = json.loads((folder / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return None
    pid = record.get("pid") if isinstance(record, dict) else None
    if not isinstance(pid, int) or record.get("host") not in (None, socket.gethostname()):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    try:  # a killed process not yet reaped (a zombie) holds no lock
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return None
    except (OSError, IndexError):
        pass
    return pid


def _logged_step(folder: Path) -> int | None:
    """The last step of the run's metrics log (torch-free), if it has one."""
    from searchgym.agents.training.metrics import read_metrics

    if not (folder / "metrics.jsonl").is_file():
        return None
    try:
        return max((int(r["step"]) for r in read_metrics(folder)), default=None)
    except (OSError, ValueError):
        return None


def _manifest_after_checkpoint(folder: Path) -> bool:
    """Whether the run's ``manifest.json`` (written by ``train grpo`` once it has finished) is newer than its
    checkpoint: a run killed between its last save and its manifest is resumed (it only writes the manifest)."""
    manifest, checkpoint = folder / "manifest.json", folder / "checkpoint.pt"
    return manifest.is_file() and manifest.stat().st_mtime >= checkpoint.stat().st_mtime


def _checkpoint_step(folder: Path) -> int | None:
    from searchgym.agents.training.checkpoint import peek_checkpoint

    payload = peek_checkpoint(folder / "checkpoint.pt")
    step = (payload or {}).get("step")
    return int(step) if isinstance(step, int) else None


def run_states(
    protocol: Protocol, runs: Path | None = None, summaries: Path | None = None, exact: bool = True
) -> list[RunState]:
    """Every run's state, seed-major. ``exact`` reads a checkpoint's step (this imports torch); otherwise a
    folder with a checkpoint is judged by its metrics log, enough to say what is left."""
    folder_of_summaries = summaries or protocol.summaries_dir
    have = load_summaries(folder_of_summaries) if folder_of_summaries.is_dir() else {}
    steps = protocol.steps
    out = []
    for arm, seed in protocol.runs():
        folder = run_dir(protocol, arm, seed, runs)
        if seed in have.get(arm, {}):
            out.append(RunState(arm, seed, "summarised", int(have[arm][seed]["steps"])))
            continue
        pid = _live_holder(folder)
        logged = _logged_step(folder)
        if pid is not None:
            out.append(RunState(arm, seed, "running", logged, f"process {pid}"))
        elif (folder / "checkpoint.pt").is_file():
            step = _checkpoint_step(folder) if exact else logged
            state = "finished" if step == steps and _manifest_after_checkpoint(folder) else "partial"
            out.append(RunState(arm, seed, state, step))
        elif logged is not None or (folder / "metrics.jsonl").exists():
            out.append(RunState(arm, seed, "started", logged, "no checkpoint yet"))
        else:
            out.append(RunState(arm, seed, "new"))
    return out


def status(protocol: Protocol, runs: Path | None = None, summaries: Path | None = None) -> str:
    """What ran, what is running or partial, what is left: one line per run, then the counts."""
    states = run_states(protocol, runs, summaries, exact=False)
    steps = protocol.steps
    lines = [
        f"study {protocol.name}: {len(states)} runs ({len(protocol.arms)} arms x {len(protocol.seeds)} seeds, "
        f"{steps} steps each); runs in {runs or protocol.runs_dir}, summaries in {summaries or protocol.summaries_dir}"
    ]
    words = {
        "summarised": "done (summarised)",
        "finished": "finished at step {step}; its summary is written by the next `study run`",
        "partial": "partial: logged up to step {step} of {steps}; `study run` resumes it from its checkpoint",
        "running": "running ({note}), logged up to step {step} of {steps}",
        "started": "started, no checkpoint yet (logged up to step {step}); `study run` starts it again",
        "new": "not started",
    }
    for s in states:
        lines.append(
            f"  {s.name}: {words[s.state].format(step=s.step if s.step is not None else 0, steps=steps, note=s.note)}"
        )
    counts = {k: sum(s.state == k for s in states) for k in words}
    left = counts["partial"] + counts["started"] + counts["new"] + counts["finished"]
    lines.append(
        f"done {counts['summarised']}, running {counts['running']}, partial {counts['partial']}, "
        f"left {left} of {len(states)}"
    )
    return "\n".join(lines)


def check_warmstart(protocol: Protocol) -> None:
    """The warm-start exists and its SHA-256 starts with the protocol's digest.

    Raises:
        ConfigError: it is missing, or its digest differs.
    """
    from searchgym.integrity import file_sha256

    path = protocol.warmstart
    if not path.is_file():
        raise ConfigError(f"warm-start {path} does not exist ({protocol.path} [warmstart] path)")
    digest = file_sha256(path, remember=False)
    want = protocol.warmstart_sha256
    if not digest.startswith(want):
        raise ConfigError(
            f"warm-start {path}: sha256 {digest[: max(len(want), 12)]}…, the protocol says {want}…: "
            "another file than the one the study was registered with"
        )


def check_run_folders(protocol: Protocol, states: Sequence[RunState], runs: Path) -> None:
    """Every run folder the study would write into is its own (see the module's docstring).

    Raises:
        ConfigError: one is not, named with the reason.
    """
    digest = protocol_sha256(protocol)
    for s in states:
        if s.state not in ("new", "started", "partial", "finished"):
            continue
        folder = run_dir(protocol, s.arm, s.seed, runs)
        why = refusal(protocol, s.arm, s.seed, folder, digest)
        if why is not None:
            raise ConfigError(
                f"{folder.resolve()}: not a run folder of study {protocol.name!r} ({protocol.path}): {why}; a study "
                "writes only into run folders it started: point [study] runs (or --runs) elsewhere, or move "
                "that folder away"
            )


def command(protocol: Protocol, arm: str, seed: int, folder: Path, resume: bool) -> list[str]:
    """The ``searchgym train grpo`` arguments of one run (the program excluded)."""
    options = {
        **protocol.options(arm),
        "init": str(protocol.warmstart),
        "seed": seed,
        "run_dir": str(folder),
    }
    args = ["train", "grpo"]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    args.append("--resume" if resume else "--overwrite")
    return args


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= FLOAT_TOLERANCE * max(1.0, abs(float(a)))
    return bool(a == b)


def check_summaries(protocol: Protocol, summaries: Path) -> None:
    """Every summary already in ``summaries`` ran with the protocol's options (those it records)."""
    have = load_summaries(summaries) if summaries.is_dir() else {}
    for arm, by_seed in have.items():
        if arm not in protocol.arms:
            continue
        options = protocol.options(arm)
        for seed, s in by_seed.items():
            config = s.get("config", {})
            for key, want in options.items():
                if key in config and config[key] is not None and not _same(config[key], want):
                    raise ConfigError(
                        f"{summary_path(summaries, arm, seed)} ran with {key} = {config[key]!r}, but "
                        f"{protocol.path} says {want!r}: move that summary away, or restore the protocol"
                    )


def _keys(protocol: Protocol) -> list[str]:
    keys = list(CONFIG_KEYS)
    for arm in protocol.arms:
        keys += [k for k in protocol.options(arm) if k not in keys]
    return keys


def _curves(protocol: Protocol, folder: Path) -> list[str]:
    """The default curves, those the protocol's definitions read, and every custom loss term's metrics."""
    from searchgym.agents.training.metrics import read_metrics

    curves = list(CURVES)
    for d in protocol.all_definitions().values():
        curves += [m for m in d.metrics if m not in curves]
    logged = {k for r in read_metrics(folder) for k in r}
    curves += sorted(k for k in logged if k.startswith("train/loss_term/") and k not in curves)
    return curves


def _summarise(
    protocol: Protocol, arm: str, seed: int, folder: Path, summaries: Path, commit: str | None
) -> dict[str, Any]:
    summary = run_summary(folder, commit, _curves(protocol, folder), _keys(protocol))
    summary["arm"], summary["seed"] = arm, seed
    write_summary(summary_path(summaries, arm, seed), summary)
    return summary


@dataclass
class _Job:
    arm: str
    seed: int
    folder: Path
    process: subprocess.Popen[bytes]
    started: float
    log: Any


def run_study(
    protocol: Protocol,
    jobs: int = 1,
    runs: Path | None = None,
    summaries: Path | None = None,
    only: Sequence[str] | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """Plays the study's missing runs, ``jobs`` at a time, and writes each run's summary as it lands.

    Checks first, before any run: the warm-start's digest, every summary already written against the
    protocol's options, and each custom loss term (imported and checked to be callable). ``only`` limits the
    runs to those named ``ARM`` or ``ARM/sSEED``.

    Returns:
        The number of runs that failed (0: every run asked for is summarised).

    Raises:
        ConfigError: a check above fails.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    runs = runs or protocol.runs_dir
    summaries = summaries or protocol.summaries_dir
    check_warmstart(protocol)
    check_summaries(protocol, summaries)
    _check_loss_terms(protocol)
    check_run_folders(protocol, run_states(protocol, runs, summaries), runs)  # before the lock is written
    from searchgym.run_lock import lock_run_dir

    lock = lock_run_dir(
        runs,
        name=STUDY_LOCK,
        busy="another study run holds {path}: {holder}; wait for it to end, or stop it",
    )
    try:
        return _run_locked(protocol, jobs, runs, summaries, only, say)
    finally:
        lock.release()


def _run_locked(
    protocol: Protocol,
    jobs: int,
    runs: Path,
    summaries: Path,
    only: Sequence[str] | None,
    say: Callable[[str], None],
) -> int:
    """:func:`run_study` once its checks passed and its lock is held."""
    states = run_states(protocol, runs, summaries)
    check_run_folders(protocol, states, runs)
    digest = protocol_sha256(protocol)
    if only:
        unknown = [o for o in only if not any(o in (s.arm, f"{s.arm}/s{s.seed}") for s in states)]
        if unknown:
            raise ConfigError(
                f"--only {unknown[0]!r} names no run; runs are ARM or ARM/sSEED, e.g. {states[0].arm}/s{states[0].seed}"
            )
        states = [s for s in states if s.arm in only or f"{s.arm}/s{s.seed}" in only]
    commit = git_commit(Path(__file__).resolve().parent)
    done = sum(s.state == "summarised" for s in states)
    todo = [s for s in states if s.state in ("new", "started", "partial", "finished")]
    busy = [s for s in states if s.state == "running"]
    say(
        f"study {protocol.name}: {len(states)} runs, {done} summarised, {len(todo)} to play "
        f"({sum(s.state == 'partial' for s in todo)} resumed), {len(busy)} running elsewhere; {jobs} at a time"
    )
    for s in busy:
        say(f"skip {s.name}: running ({s.note})")
    failed = 0
    running: list[_Job] = []
    queue = list(todo)
    finished = done
    try:
        while queue or running:
            while queue and len(running) < jobs:
                s = queue.pop(0)
                folder = run_dir(protocol, s.arm, s.seed, runs)
                if s.state == "finished":
                    summary = _summarise(protocol, s.arm, s.seed, folder, summaries, commit)
                    finished += 1
                    say(_landed(s.name, summary, summaries, finished, len(states), "summarised"))
                    continue
                running.append(_start(protocol, s, folder, digest))
                say(
                    f"start {s.name}"
                    + (f" (resumes from step {s.step} of {protocol.steps})" if s.state == "partial" else "")
                )
            time.sleep(0.2)
            for job in [j for j in running if j.process.poll() is not None]:
                running.remove(job)
                ok = _finish(protocol, job, summaries, commit)
                if isinstance(ok, dict):
                    finished += 1
                    say(
                        _landed(
                            f"{job.arm} s{job.seed}",
                            ok,
                            summaries,
                            finished,
                            len(states),
                            f"done in {_minutes(job)}",
                        )
                    )
                else:
                    failed += 1
                    say(f"FAILED {job.arm} s{job.seed} ({ok}); log: {job.folder / LOG}")
    except KeyboardInterrupt:
        for job in running:  # they received the Ctrl-C too; wait for them to leave their checkpoints
            try:
                job.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.process.kill()
            _add_wall(job)
            job.log.close()
        raise
    left = len(states) - finished - len(busy)
    say(f"study {protocol.name}: {finished} of {len(states)} runs summarised, {failed} failed, {left} left")
    return failed


RUN_CLI = "import sys; del sys.path[0]; from searchgym.app.cli import main; sys.exit(main())"
"""How a run's process starts the command line: the searchgym this interpreter has installed, never a
``searchgym/`` folder that the working directory happens to hold (``python -m`` would put the working
directory first on ``sys.path``; a custom arm's module is found there by its own loader all the same)."""


def _start(protocol: Protocol, s: RunState, folder: Path, digest: str) -> _Job:
    folder.mkdir(parents=True, exist_ok=True)
    write_mark(protocol, s.arm, s.seed, folder, digest)
    args = command(protocol, s.arm, s.seed, folder, resume=s.state == "partial")
    if s.state != "partial":
        (folder / WALL).unlink(missing_ok=True)
    (folder / COMMAND).write_text(shlex.join(["searchgym", *args]) + "\n")
    log = open(folder / LOG, "ab")  # noqa: SIM115 - held until the process ends
    log.write(f"\n== {time.strftime('%Y-%m-%d %H:%M:%S')} searchgym {shlex.join(args)}\n".encode())
    log.flush()
    process = subprocess.Popen(
        [sys.executable, "-c", RUN_CLI, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    return _Job(s.arm, s.seed, folder, process, time.monotonic(), log)


def _add_wall(job: _Job) -> None:
    """Adds this segment's seconds to the run's wall time (a resumed run counts every segment)."""
    path = job.folder / WALL
    before = float(path.read_text()) if path.is_file() and path.read_text().strip() else 0.0
    path.write_text(f"{before + time.monotonic() - job.started:.2f}\n")


def _finish(protocol: Protocol, job: _Job, summaries: Path, commit: str | None) -> dict[str, Any] | str:
    """The summary of a run whose process ended, or why there is none."""
    _add_wall(job)
    job.log.close()
    code = job.process.returncode
    if code != 0:
        tail = (job.folder / LOG).read_text(errors="replace").strip().splitlines()
        last = next((line for line in reversed(tail) if line.strip()), "")
        return f"exit {code}: {last[:300]}"
    step = _checkpoint_step(job.folder)
    if step != protocol.steps:
        return f"its checkpoint holds step {step}, not {protocol.steps}"
    return _summarise(protocol, job.arm, job.seed, job.folder, summaries, commit)


def _minutes(job: _Job) -> str:
    return f"{(time.monotonic() - job.started) / 60:.1f} min"


def _landed(name: str, summary: dict[str, Any], summaries: Path, n: int, total: int, how: str) -> str:
    final = summary["eval"].get(str(summary["steps"]), {}).get("em")
    em = f", final greedy EM {final:.3f}" if final is not None else ""
    path = summary_path(summaries, summary["arm"], summary["seed"])
    return f"[{n}/{total}] {name}: {how}, {summary['steps']} steps{em} -> {path}"


def _check_loss_terms(protocol: Protocol) -> None:
    """Each arm's custom loss term imports and is callable (before any run starts)."""
    specs = {str(o["loss_term"]) for o in protocol.arms.values() if o.get("loss_term")}
    if not specs:
        return
    from searchgym.agents.grpo.loss_term import load_loss_term

    for spec in sorted(specs):
        load_loss_term(spec)
