"""``searchgym validate-env``: the local semantic checks of OpenEnv's validation RFC, run on a live server.

Each check plays episodes through OpenEnv's client (:class:`~searchgym.app.openenv.SearchQAEnvClient`) and the
server's HTTP routes, and passes or fails with one line saying why:

* ``oracle``: the oracle's replay (searches that retrieve every supporting passage, then the golden answer)
  reaches the maximum reward on every question played;
* ``floor``: the canaries — an empty answer, no answer, a candidate list that holds the golden answer, the
  golden answer written in a search query — all score the floor, a margin below the maximum;
* ``leakage``: no golden answer in the prompt (the question itself aside), in an observation's metadata
  before the episode ends, in ``state()``, in ``/metadata``, ``/schema`` or the manifest;
* ``determinism``: two sessions reset with one seed play the same episode, observations byte for byte;
* ``state``: ``state()`` carries an episode id and a step count that follows the turns;
* ``tools``: the agent's tools are exactly ``search`` and ``answer`` (task discovery is not one of them).

The reward range, the oracle tolerance and the floor margin come from the manifest's ``validation`` block
(``openenv.yaml``).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from searchgym.app.hub.parity import Trajectory, build_trajectories
from searchgym.data import Question
from searchgym.envs.messages import TOOLS, shared_parts
from searchgym.envs.spec import EnvSpec
from searchgym.errors import ConfigError
from searchgym.rewards import normalize_answer

__all__ = ["CHECKS", "CheckResult", "Validation", "read_validation", "run_checks"]


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: its name, whether it passed, and one line saying what it saw."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Validation:
    """The manifest's ``validation`` numbers the checks hold the server to."""

    reward_min: float = 0.0
    reward_max: float = 1.0
    oracle_tolerance: float = 0.0
    floor_margin: float = 0.1


def read_validation(manifest: str | Path) -> tuple[Validation, str]:
    """The ``validation`` block of an OpenEnv manifest (``openenv.yaml``) and the manifest's text.

    Raises:
        ConfigError: the file is missing, not YAML, or its reward range is not two numbers.
    """
    import yaml  # type: ignore[import-untyped]  # installed with openenv

    path = Path(manifest)
    try:
        text = path.read_text()
        block = (yaml.safe_load(text) or {}).get("validation") or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the manifest: {e}") from None
    reward = block.get("reward") or {}
    low, high = reward.get("range", [0.0, 1.0])
    if not all(isinstance(x, int | float) for x in (low, high)) or low >= high:
        raise ConfigError(f"{path}: validation.reward.range must be [low, high], got {reward.get('range')!r}")
    return (
        Validation(
            float(low),
            float(high),
            float(reward.get("oracle_tolerance", 0.0)),
            float(reward.get("floor_margin", 0.1)),
        ),
        text,
    )


class _Session:
    """One client session and the episodes it has seen (every observation, as JSON)."""

    def __init__(self, url: str) -> None:
        from searchgym.app.openenv import SearchQAEnvClient

        self._client = SearchQAEnvClient(base_url=url).sync()
        self._client.connect()
        self.seen: list[dict[str, Any]] = []
        self.states: list[dict[str, Any]] = []

    def close(self) -> None:
        self._client.close()

    def play(self, traj: Trajectory, *, question_id: bool = True) -> tuple[float, str | None]:
        """Plays a trajectory; returns its reward and end, recording each observation and state."""
        from searchgym.app.openenv import SearchQAAction

        result = self._client.reset(seed=traj.seed, question_id=traj.question_id if question_id else None)
        self.seen.append(result.observation.model_dump())
        self.states.append(self._client.state().model_dump())
        for tool, text in traj.turns:
            if tool is None:
                continue
            result = self._client.step(SearchQAAction(tool=tool, text=text))
            self.seen.append(result.observation.model_dump())
            self.states.append(self._client.state().model_dump())
            if result.done:
                return float(result.reward or 0.0), result.observation.metadata.get("end_reason")
        return 0.0, None


def _mentions(text: str, answer: str) -> bool:
    """Whether ``text`` holds ``answer`` as whole words, both normalised as the metrics normalise."""
    needle = normalize_answer(answer)
    return (
        bool(needle) and re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", normalize_answer(text)) is not None
    )


_AGENT_FIELDS = ("queries", "answer", "reward")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return str(r.read().decode())


def _oracle(s: _Session, trajs: list[Trajectory], v: Validation) -> CheckResult:
    oracle = [t for t in trajs if t.name.startswith("oracle/")]
    misses = []
    for t in oracle:
        reward, _ = s.play(t)
        if reward < v.reward_max - v.oracle_tolerance:
            misses.append(f"{t.question_id}: {reward}")
    if misses:
        return CheckResult("oracle", False, f"the oracle misses the maximum {v.reward_max} on {misses}")
    return CheckResult("oracle", True, f"{len(oracle)} oracle replays score {v.reward_max}")


def _floor(s: _Session, trajs: list[Trajectory], v: Validation) -> CheckResult:
    canaries = [t for t in trajs if t.name.startswith("canary/")]
    over = []
    for t in canaries:
        reward, _ = s.play(t)
        if reward != v.reward_min or v.reward_max - reward < v.floor_margin:
            over.append(f"{t.name}: {reward}")
    if over:
        return CheckResult("floor", False, f"canaries above the floor {v.reward_min}: {over}")
    kinds = sorted({t.name.split("/")[1] for t in canaries})
    return CheckResult("floor", True, f"{len(canaries)} canaries ({', '.join(kinds)}) score {v.reward_min}")


def _leakage(
    s: _Session, trajs: list[Trajectory], questions: dict[str, Question], url: str, manifest: str
) -> CheckResult:
    played = {t.question_id for t in trajs}
    leaks: list[str] = []
    for obs, state in zip(s.seen, s.states, strict=True):
        question = questions[obs["question_id"]]
        prompt = obs["text"].replace(question.question, "") if obs["turn"] == 0 else ""
        before_end = {} if obs["done"] else obs["metadata"]
        for golden in question.golden_answers:
            if _mentions(question.question, golden):
                continue  # the question names its answer (a comparison question): not a leak
            places = {
                "prompt": prompt,
                "metadata": json.dumps(before_end),
                # The agent's own moves (its queries, its answer) echoed back are not a leak.
                "state": json.dumps({k: v for k, v in state.items() if k not in _AGENT_FIELDS}),
            }
            leaks += [
                f"{where} of {question.id}" for where, text in places.items() if _mentions(text, golden)
            ]
    routes = {"/metadata": _get(f"{url}/metadata"), "/schema": _get(f"{url}/schema")}
    if manifest:
        routes["manifest"] = manifest
    for qid in sorted(played):
        for golden in questions[qid].golden_answers:
            leaks += [f"{where} ({qid})" for where, text in routes.items() if _mentions(text, golden)]
    if leaks:
        return CheckResult("leakage", False, f"golden answers found in: {sorted(set(leaks))[:10]}")
    return CheckResult(
        "leakage",
        True,
        f"no golden answer of {len(played)} questions in prompts, metadata before the end, state(), "
        f"{', '.join(routes)}",
    )


def _determinism(url: str, trajs: list[Trajectory]) -> CheckResult:
    runs = []
    for _ in range(2):
        s = _Session(url)
        try:
            for t in trajs[:4]:
                s.play(Trajectory(t.name, t.question_id, t.turns, seed=7), question_id=False)
        finally:
            s.close()
        runs.append(json.dumps(s.seen, sort_keys=True))
    if runs[0] != runs[1]:
        return CheckResult("determinism", False, "two sessions reset with seed 7 played different episodes")
    return CheckResult("determinism", True, "two sessions reset with one seed: observations identical")


def _state(s: _Session, trajs: list[Trajectory]) -> CheckResult:
    s.seen, s.states = [], []
    t = next(t for t in trajs if t.name.startswith("oracle/"))
    s.play(t)
    steps = [st.get("step_count") for st in s.states]
    ids = {st.get("episode_id") for st in s.states}
    want = list(range(len(s.states)))
    if None in ids or "" in ids or len(ids) != 1 or steps != want:
        return CheckResult("state", False, f"state(): episode ids {ids}, step counts {steps} (want {want})")
    return CheckResult("state", True, f"state() carries one episode id and step counts {steps}")


def _tools(url: str) -> CheckResult:
    schema = json.loads(_get(f"{url}/schema"))
    action = schema.get("action", {})
    tool = action.get("properties", {}).get("tool", {})
    offered = tool.get("enum") or [c.get("const") for c in tool.get("anyOf", []) if "const" in c]
    if sorted(offered or []) != sorted(TOOLS):
        return CheckResult("tools", False, f"the action's tools are {offered}, not exactly {list(TOOLS)}")
    extra = sorted(set(action.get("properties", {})) - {"tool", "text", "metadata"})
    if extra:
        return CheckResult("tools", False, f"the action has fields beyond the tool and its text: {extra}")
    return CheckResult("tools", True, f"the action offers exactly {list(TOOLS)}")


CHECKS = ("oracle", "floor", "leakage", "determinism", "state", "tools")
"""The checks, in the order they run."""


def run_checks(
    url: str,
    spec: EnvSpec,
    *,
    manifest: str | Path | None = None,
    questions: int = 5,
    only: Sequence[str] = CHECKS,
) -> list[CheckResult]:
    """Runs the checks against the SearchQA OpenEnv server at ``url``, which serves ``spec``.

    Args:
        url: The server, e.g. ``http://127.0.0.1:8000``.
        spec: The settings the server was started with (the checks build the oracle's and the canaries'
            moves from its dataset and retriever).
        manifest: The OpenEnv manifest with the ``validation`` block (default: ``openenv.yaml`` of the
            current folder if there is one, else :class:`Validation`'s numbers, which are searchgym's
            manifest's, and no manifest to search for leaks).
        questions: Questions per kind of trajectory.
        only: The checks to run (default: all of :data:`CHECKS`).

    Raises:
        ConfigError: an unknown check name, or an unreadable manifest.
    """
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        raise ConfigError(f"unknown checks {unknown}; valid: {list(CHECKS)}")
    if manifest is None and Path("openenv.yaml").is_file():
        manifest = "openenv.yaml"
    validation, manifest_text = read_validation(manifest) if manifest is not None else (Validation(), "")
    trajs = [t for t in build_trajectories(spec, per_kind=questions) if t.group == "default"]
    data, _ = shared_parts(spec)
    by_id = {q.id: q for q in data.questions(spec.split)}
    session = _Session(url)
    checks: dict[str, Callable[[], CheckResult]] = {
        "oracle": lambda: _oracle(session, trajs, validation),
        "floor": lambda: _floor(session, trajs, validation),
        "leakage": lambda: _leakage(session, trajs, by_id, url, manifest_text),
        "determinism": lambda: _determinism(url, trajs),
        "state": lambda: _state(session, trajs),
        "tools": lambda: _tools(url),
    }
    try:
        if "leakage" in only:  # leakage reads what the other checks' episodes showed: play some first
            for t in trajs[: 2 * questions]:
                session.play(t)
        return [checks[name]() for name in CHECKS if name in only]
    finally:
        session.close()


def results_json(results: Sequence[CheckResult]) -> str:
    """The results as JSON: ``{"passed": bool, "checks": [{"name", "passed", "detail"}, ...]}``."""
    return json.dumps(
        {"passed": all(r.passed for r in results), "checks": [asdict(r) for r in results]}, indent=2
    )
