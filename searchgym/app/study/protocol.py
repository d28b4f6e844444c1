"""A pre-registered study as a TOML file: what runs, and how its runs are judged.

The tables (docs/study.md gives a worked example):

* ``[study]``: ``name``, ``seeds``, ``control`` (the frozen arm that pairs each seed, optional),
  ``runs`` (run folders ``ARM/sSEED``) and ``summaries`` (one JSON per finished run), both relative to the
  protocol file;
* ``[warmstart]``: ``path`` (relative to the protocol file) and ``sha256`` (the digest or a prefix of at
  least 8 hex digits), checked before any run;
* ``[train]``: the options every arm shares, by :class:`~searchgym.agents.grpo.config.GRPOConfig`'s option
  names (``questions_per_step``, not ``--questions-per-step``);
* ``[evaluation]``: greedy evaluations, ``steps`` (evenly spaced, ending at the last step; 0 is the
  warm-start's evaluation), ``questions``, ``split``, ``batch``;
* ``[arms.NAME]``: each arm's own options over ``[train]``; a custom loss term is an arm with
  ``loss_term = "module:function"`` and ``loss_term_coef``;
* ``[definitions.NAME]`` and ``[signals.NAME]``: per-run findings of a kind (:mod:`.rules`); signals are
  the warning signals whose lead the report measures;
* ``[[criteria]]``: ``id``, ``name``, ``kind`` and its parameters;
* ``[report]``: ``event`` (the definition leads are measured against), ``figure`` (a path), ``losses`` (arms
  whose questions lost between their peak and their end are counted by kind and failure stage).

Every problem is one :class:`~searchgym.errors.ConfigError` line naming the file, the table and the key.
"""

from __future__ import annotations

import difflib
import re
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError

from .criteria import CRITERION_KINDS
from .params import as_names
from .rules import DEFINITION_KINDS, EVAL_EM, check_definition, read_params

if sys.version_info >= (3, 11):  # noqa: UP036 - the package installs on Python 3.10 too
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["DEFAULT_SIGNALS", "STUDY_OPTIONS", "Criterion", "Definition", "Protocol", "load_protocol"]

TABLES = ("study", "warmstart", "train", "evaluation", "arms", "definitions", "signals", "criteria", "report")
STUDY_OPTIONS = {
    "run_dir": "the study puts each run in RUNS/ARM/sSEED",
    "resume": "the study resumes a killed run by itself",
    "overwrite": "the study never replaces a finished run",
    "init": "the study starts every arm from [warmstart] path",
    "seed": "the study runs each arm once per seed of [study] seeds",
    "eval_every": "set the evaluation points in [evaluation] steps",
    "eval_at_start": "set the evaluation points in [evaluation] steps",
    "eval_questions": "set [evaluation] questions",
    "eval_split": "set [evaluation] split",
    "eval_batch": "set [evaluation] batch",
}
"""``train grpo`` options the study sets itself, and where a protocol says what they should be."""
STUDY_PATHS = ("shared_prefix", "precision")
"""Options that change a step's float rounding, not what it computes: every arm of a study runs on one path,
so an arm may not set them (they go in ``[train]``)."""
ARM_NAME = re.compile(r"[A-Za-z0-9._\-]+")
HEX = re.compile(r"[0-9a-f]{8,64}")

DEFAULT_SIGNALS: dict[str, dict[str, Any]] = {
    "probe": {"kind": "drawdown", "metric": "lld/probe_onpolicy_heldout", "drop": 0.05},
    "ledger": {"kind": "threshold", "metric": "lld/ledger_delta", "at_most": -0.1},
    "entropy": {"kind": "departure", "metric": "train/entropy", "fraction": 0.25, "direction": "either"},
    "grad_norm": {"kind": "departure", "metric": "train/grad_norm", "fraction": 0.5, "direction": "up"},
    "searches": {"kind": "departure", "metric": "rollout/searches", "fraction": 0.25, "direction": "down"},
    "response_length": {
        "kind": "departure",
        "metric": "rollout/response_length",
        "fraction": 0.25,
        "direction": "either",
    },
}
"""The warning signals every report measures besides a protocol's own (one per watched metric; a protocol
signal on the same metric replaces the default): the held-out on-policy probe 0.05 nat/token below its
best, the ledger at -0.1 nat/token, and entropy, gradient norm, search rate and response length departing
from their steps-1–10 mean by the fraction given (5-step trailing means). Exploratory rules, not criteria."""


@dataclass(frozen=True)
class Definition:
    """A named per-run finding: its kind and checked parameters."""

    name: str
    kind: str
    params: dict[str, Any]

    @property
    def event(self) -> bool:
        return DEFINITION_KINDS[self.kind].event

    @property
    def metrics(self) -> tuple[str, ...]:
        """The curves it reads."""
        out = [self.params["metric"]] if "metric" in self.params else []
        out += [m for m, _ in self.params.get("rules", ())]
        if self.kind == "behaviour_collapse":
            out += ["rollout/answered", "rollout/searches"]
        return tuple(m for m in out if m != EVAL_EM)


@dataclass(frozen=True)
class Criterion:
    """A pre-registered criterion: ``id`` (C1, L2 …), ``name``, kind and checked parameters."""

    id: str
    name: str
    kind: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Evaluation:
    """Greedy evaluations: at ``steps`` on the first ``questions`` of ``split``, ``batch`` at a time."""

    steps: tuple[int, ...]
    questions: int
    split: str
    batch: int | None


@dataclass(frozen=True)
class Protocol:
    """A study read from its TOML file (:func:`load_protocol`)."""

    path: Path
    name: str
    seeds: tuple[int, ...]
    control: str | None
    runs_dir: Path
    summaries_dir: Path
    warmstart: Path
    warmstart_sha256: str
    train: dict[str, Any]
    arms: dict[str, dict[str, Any]]
    evaluation: Evaluation | None
    definitions: dict[str, Definition]
    signals: dict[str, Definition]
    criteria: tuple[Criterion, ...]
    event: str | None
    figure: Path | None
    losses: tuple[str, ...] = ()

    @property
    def steps(self) -> int:
        """Training steps of every run."""
        from searchgym.agents.grpo.config import GRPOConfig

        return int(self.train.get("steps", _field_default(GRPOConfig, "steps")))

    def runs(self) -> list[tuple[str, int]]:
        """Every run, seed-major (each seed's arms in the file's order, then the next seed)."""
        return [(arm, seed) for seed in self.seeds for arm in self.arms]

    def options(self, arm: str) -> dict[str, Any]:
        """The ``train grpo`` options of ``arm`` (but for run folder, init and seed): ``[train]``, the arm's
        own, the evaluation points, one thread, no progress bar and no TensorBoard events."""
        out: dict[str, Any] = {"threads": 1, **self.train, **self.arms[arm]}
        out |= {"progress": False, "tensorboard": False}
        ev = self.evaluation
        if ev is None:
            return out | {"eval_questions": 0}
        later = [t for t in ev.steps if t > 0]
        every = later[0] if len(later) > 1 else 0
        out |= {"eval_questions": ev.questions, "eval_split": ev.split, "eval_every": every}
        out["eval_at_start"] = 0 in ev.steps
        if ev.batch is not None:
            out["eval_batch"] = ev.batch
        return out

    def all_definitions(self) -> dict[str, Definition]:
        """Definitions and signals (the report's signals, defaults included), by name."""
        return {**self.definitions, **self.report_signals()}

    def report_signals(self) -> dict[str, Definition]:
        """The protocol's signals, then each default signal on a metric none of them watches."""
        watched = {m for d in self.signals.values() for m in d.metrics}
        out = dict(self.signals)
        for name, table in DEFAULT_SIGNALS.items():
            if table["metric"] not in watched and name not in out and name not in self.definitions:
                kind, params = read_params(DEFINITION_KINDS, table, f"default signal {name}", ())
                out[name] = Definition(name, kind, params)
        return out

    def lead_event(self) -> str | None:
        """The event the report measures every signal's lead against: ``[report] event``, else the event of
        the first ``lead`` criterion, else the first event definition."""
        if self.event is not None:
            return self.event
        for c in self.criteria:
            if c.kind == "lead":
                return str(c.params["event"])
        return next((n for n, d in self.definitions.items() if d.event), None)


def _field_default(cls: type, name: str) -> Any:
    """An option's default in ``cls``: its section's default value of it (a config may give a section other
    defaults than the section's class, e.g. GRPO's weight decay)."""
    from searchgym.options import flat_values

    return flat_values(cls())[name]


def _table(doc: Mapping[str, Any], key: str, where: str, required: bool = False) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{where}: no [{key}] table")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [{key}] must be a table, got {type(value).__name__}")
    return value


def _unknown(table: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(known)}"
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")


def load_protocol(path: str | Path) -> Protocol:
    """Reads and checks a protocol file.

    Raises:
        ConfigError: the file is missing or not TOML, a table or key is unknown or misspelt, an option is
            not a ``train grpo`` option or has the wrong type, an arm's options fail ``GRPOConfig``'s own
            checks, or a definition or criterion is malformed or names one that does not exist.
    """
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read the protocol {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses into nested arrays and tables
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise ConfigError(f"{path}: not valid TOML: {str(e).splitlines()[0][:200]}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    where = str(path)
    _unknown(doc, TABLES, where)
    here = path.resolve().parent
    study = _table(doc, "study", where, required=True)
    _unknown(study, ("name", "seeds", "control", "runs", "summaries"), f"{where}: [study]")
    name = study.get("name", path.stem)
    seeds = study.get("seeds")
    if not (
        isinstance(seeds, list)
        and seeds
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        and len(set(seeds)) == len(seeds)
    ):
        raise ConfigError(f"{where}: [study] seeds must be a list of distinct integers >= 0, got {seeds!r}")
    warm = _warmstart(doc, where, here)
    arms_table = _table(doc, "arms", where, required=True)
    if not arms_table:
        raise ConfigError(f"{where}: [arms] is empty; give each arm a table [arms.NAME]")
    train = _options(_table(doc, "train", where), f"{where}: [train]")
    arms = {}
    for arm, table in arms_table.items():
        if not ARM_NAME.fullmatch(arm):
            raise ConfigError(f"{where}: arm name {arm!r}: use letters, digits, '.', '_' and '-' only")
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [arms.{arm}] must be a table of options")
        arms[arm] = _options(table, f"{where}: [arms.{arm}]")
        for key in STUDY_PATHS:
            if key in arms[arm]:
                raise ConfigError(
                    f"{where}: [arms.{arm}] {key}: a scoring path is the study's, not an arm's (arms on "
                    f"different paths part by float rounding); set it in [train] for every arm"
                )
    control = study.get("control")
    if control is not None and control not in arms:
        raise ConfigError(f"{where}: [study] control {control!r} is not an arm; arms: {', '.join(arms)}")
    evaluation = _evaluation(_table(doc, "evaluation", where), f"{where}: [evaluation]")
    definitions = _definitions(_table(doc, "definitions", where), f"{where}: [definitions", control)
    signals = _definitions(_table(doc, "signals", where), f"{where}: [signals", control)
    for n, d in signals.items():
        if not d.event:
            raise ConfigError(f"{where}: [signals.{n}] must be an event kind (a step), not {d.kind!r}")
        if n in definitions:
            raise ConfigError(f"{where}: {n!r} is both a definition and a signal; rename one")
    report = _table(doc, "report", where)
    _unknown(report, ("event", "figure", "losses"), f"{where}: [report]")
    losses = as_names(report["losses"], f"{where}: [report] losses") if "losses" in report else ()
    for arm in losses:
        if arm not in arms:
            raise ConfigError(f"{where}: [report] losses: no arm named {arm!r}; arms: {', '.join(arms)}")
    protocol = Protocol(
        path=path,
        name=str(name),
        seeds=tuple(seeds),
        control=control,
        runs_dir=_path(here, study.get("runs", f"runs/{name}"), f"{where}: [study] runs"),
        summaries_dir=_path(here, study.get("summaries", str(name)), f"{where}: [study] summaries"),
        warmstart=warm[0],
        warmstart_sha256=warm[1],
        train=train,
        arms=arms,
        evaluation=evaluation,
        definitions=definitions,
        signals=signals,
        criteria=_criteria(doc.get("criteria", []), where),
        event=report.get("event"),
        figure=here / report["figure"] if "figure" in report else None,
        losses=losses,
    )
    _check_references(protocol, where)
    if evaluation is not None and evaluation.steps[-1] != protocol.steps:
        raise ConfigError(
            f"{where}: [evaluation] steps end at {evaluation.steps[-1]}, but the runs train {protocol.steps} "
            "steps (the trainer evaluates at the last step)"
        )
    _check_arms(protocol, where)
    return protocol


def _warmstart(doc: Mapping[str, Any], where: str, here: Path) -> tuple[Path, str]:
    if "warmstart" not in doc:
        raise ConfigError(
            f"{where}: no [warmstart] table: every arm starts from one checkpoint; give its path and sha256"
        )
    warm = _table(doc, "warmstart", where)
    _unknown(warm, ("path", "sha256"), f"{where}: [warmstart]")
    if not isinstance(warm.get("path"), str) or not warm["path"]:
        raise ConfigError(f"{where}: [warmstart] needs path, the checkpoint every arm starts from")
    digest = warm.get("sha256")
    if not isinstance(digest, str) or not HEX.fullmatch(digest.lower()):
        raise ConfigError(
            f"{where}: [warmstart] needs sha256, the checkpoint's digest or its first 8 or more hex digits, "
            f"got {digest!r}"
        )
    return _path(here, warm["path"], f"{where}: [warmstart] path"), digest.lower()


def _path(here: Path, value: Any, where: str) -> Path:
    """``value``, a path relative to the protocol's folder, if the system can use it.

    Raises:
        ConfigError: it is not a non-empty string, holds a NUL, or has a name over 255 bytes or more than
            4,096 in all.
    """
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}"[:300])
    if "\x00" in value or len(value.encode("utf-8", "surrogatepass")) > 4096:
        raise ConfigError(f"{where}: not a usable path (a NUL, or more than 4,096 bytes): {value[:80]!r}…")
    if any(len(part.encode("utf-8", "surrogatepass")) > 255 for part in Path(value).parts):
        raise ConfigError(f"{where}: not a usable path (a name over 255 bytes): {value[:80]!r}…")
    return here / value


def _options(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``train grpo`` options by option name (the flag without ``--``), each checked against its field's
    type."""
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.options import flat_options

    options = flat_options(GRPOConfig)
    hints = {name: hint for name, (_, _, hint) in options.items()}
    fields = list(options)
    out = {}
    for key, value in table.items():
        if key in STUDY_OPTIONS:
            raise ConfigError(f"{where}: {key!r} is set by the study ({STUDY_OPTIONS[key]})")
        if key not in hints or key not in fields:
            near = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(
                f"{where}: unknown option {key!r}: not a field of GRPOConfig (train grpo){hint}"
            )
        out[key] = _typed(value, hints[key], f"{where} {key}")
    return out


def _typed(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against a field's type hint (``X | None`` takes an ``X``, and an optional choice
    ``"none"``, as on the command line; TOML has no null)."""
    origin = typing.get_origin(hint)
    optional = False
    if origin in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin, optional = typing.get_origin(hint), True
    if origin is typing.Literal:
        choices = (*(("none",) if optional else ()), *typing.get_args(hint))
        if value not in choices:
            raise ConfigError(f"{where}: expected one of {list(choices)}, got {value!r}")
        return value
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise ConfigError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
    return value


def _evaluation(table: Mapping[str, Any], where: str) -> Evaluation | None:
    if not table:
        return None
    _unknown(table, ("steps", "questions", "split", "batch"), where)
    steps = table.get("steps")
    if not (
        isinstance(steps, list)
        and steps
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in steps)
        and steps == sorted(set(steps))
    ):
        raise ConfigError(f"{where}: steps must be a rising list of steps, e.g. [0, 25, 50], got {steps!r}")
    later = [t for t in steps if t > 0]
    if not later:
        raise ConfigError(f"{where}: steps needs the last training step (the trainer evaluates at the end)")
    every = later[0]
    expected = [*range(every, later[-1] + 1, every)] if len(later) > 1 else later
    if len(later) > 1 and later != expected and later != [*expected, later[-1]]:
        raise ConfigError(
            f"{where}: steps {later} must be evenly spaced (the trainer evaluates every N steps and at the last)"
        )
    questions = table.get("questions")
    if isinstance(questions, bool) or not isinstance(questions, int) or questions < 1:
        raise ConfigError(f"{where}: questions must be an integer >= 1, got {questions!r}")
    from searchgym.agents.training.config import EvalConfig

    split = table.get("split", EvalConfig().split)  # the trainers' evaluation split unless named
    batch = table.get("batch")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ConfigError(f"{where}: batch must be an integer >= 1, got {batch!r}")
    return Evaluation(tuple(steps), questions, str(split), batch)


def _definitions(table: Mapping[str, Any], where: str, control: str | None) -> dict[str, Definition]:
    out = {}
    for name, spec in table.items():
        here = f"{where}.{name}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{here}: must be a table with a kind")
        kind, params = read_params(DEFINITION_KINDS, spec, here, ())
        check_definition(kind, params, here)
        if params.get("paired") and control is None:
            raise ConfigError(f"{here}: paired compares each arm with its control; set [study] control")
        out[name] = Definition(name, kind, params)
    return out


def _criteria(value: Any, where: str) -> tuple[Criterion, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: criteria must be an array of tables, [[criteria]]")
    out = []
    for i, spec in enumerate(value):
        here = f"{where}: [[criteria]] #{i + 1}"
        if not isinstance(spec, dict) or not isinstance(spec.get("id"), str) or not spec["id"]:
            raise ConfigError(f"{here}: needs an id (C1, L2 …)")
        here = f"{where}: criterion {spec['id']}"
        kind, params = read_params(CRITERION_KINDS, spec, here, ("id", "name"))
        out.append(Criterion(spec["id"], str(spec.get("name", "")), kind, params))
    ids = [c.id for c in out]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where}: criterion ids must be distinct, got {ids}")
    return tuple(out)


def _check_references(p: Protocol, where: str) -> None:
    """Every name a definition or criterion uses exists and has the right sort."""
    known = p.all_definitions()

    def need(name: str, here: str, event: bool | None = None) -> None:
        if name not in known:
            raise ConfigError(f"{here}: no definition or signal named {name!r}; defined: {', '.join(known)}")
        if event is not None and known[name].event != event:
            sort = "an event kind (a step)" if event else "a test (met or not), not an event"
            raise ConfigError(f"{here}: {name!r} must be {sort}, not {known[name].kind!r}")

    for d in p.definitions.values():
        if d.kind == "phases":
            need(d.params["event"], f"{where}: [definitions.{d.name}] event", event=True)
        if d.kind == "earlier":
            need(d.params["event"], f"{where}: [definitions.{d.name}] event", event=True)
            if d.params["against"] not in p.arms:
                raise ConfigError(
                    f"{where}: [definitions.{d.name}] against must be an arm, got {d.params['against']!r}"
                )
        if d.kind == "either":
            for name in d.params["of"]:
                need(name, f"{where}: [definitions.{d.name}] of", event=False)
                if name == d.name:
                    raise ConfigError(f"{where}: [definitions.{d.name}] of names the definition itself")
        if d.kind == "em_gain" and d.params["against"] not in ("warmstart", *p.arms):
            raise ConfigError(
                f"{where}: [definitions.{d.name}] against must be warmstart or an arm, got {d.params['against']!r}"
            )
    for c in p.criteria:
        here = f"{where}: criterion {c.id}"
        for arm in c.params["arms"]:
            if arm != "trained" and arm not in p.arms:
                raise ConfigError(f"{here}: no arm named {arm!r}; arms: {', '.join(p.arms)}")
        for clause in c.params.get("clauses", ()):
            for name in clause.when:
                need(name, here)
        if c.kind == "lead":
            need(c.params["event"], here, event=True)
            for name in c.params["signals"]:
                need(name, here, event=True)
    if p.event is not None:
        need(p.event, f"{where}: [report] event", event=True)


def _check_arms(p: Protocol, where: str) -> None:
    """Each arm's options pass GRPOConfig's own checks (cross-field rules included), before anything runs."""
    import warnings

    from searchgym.agents.grpo.config import GRPOConfig

    for arm in p.arms:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # advice (e.g. LLDS with one update a step) is not an error
                GRPOConfig(**p.options(arm), init=str(p.warmstart), seed=p.seeds[0])
        except ConfigError as e:
            raise ConfigError(f"{where}: [arms.{arm}]: {e}") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: [arms.{arm}]: {e}") from None
