"""``searchgym validate-env``: every check passes on the server as shipped and fails on a planted defect."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

pytest.importorskip("openenv", reason="OpenEnv is in the dev extra")

from pydantic import Field

from searchgym.app.hub.checks import CHECKS, read_validation, run_checks
from searchgym.app.openenv import SearchQAAction
from searchgym.app.openenv.environment import SearchQAEnvironment
from searchgym.app.openenv.models import SearchQAObservation, SearchQAState
from searchgym.envs import EnvSpec
from searchgym.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "openenv.yaml"
SPEC = EnvSpec()


def _verdicts(
    monkeypatch: pytest.MonkeyPatch,
    environment: type | None = None,
    action: type | None = None,
    only: tuple[str, ...] = CHECKS,
) -> dict[str, bool]:
    import searchgym.app.openenv.server as server_module
    from searchgym.server import ServerThread

    if environment is not None:
        monkeypatch.setattr(server_module, "SearchQAEnvironment", environment)
    if action is not None:
        monkeypatch.setattr(server_module, "SearchQAAction", action)
    with ServerThread(server_module.create_searchqa_app(SPEC)) as srv:
        results = run_checks(srv.url, SPEC, manifest=MANIFEST, questions=2, only=only)
    return {r.name: r.passed for r in results}


@pytest.fixture(scope="module")
def shipped() -> Iterator[list[Any]]:
    from searchgym.app.openenv.server import create_searchqa_app
    from searchgym.server import ServerThread

    with ServerThread(create_searchqa_app(SPEC)) as srv:
        yield run_checks(srv.url, SPEC, manifest=MANIFEST, questions=2)


def test_every_check_passes_on_the_shipped_server(shipped: list[Any]) -> None:
    assert [r.name for r in shipped] == list(CHECKS)
    assert all(r.passed for r in shipped), [r for r in shipped if not r.passed]
    assert shipped[2].detail.endswith("/metadata, /schema, manifest")  # the manifest was searched too


class CappedOracle(SearchQAEnvironment):
    """An answer metric that cannot reach 1."""

    def step(self, action: SearchQAAction, timeout_s: float | None = None, **kw: Any) -> SearchQAObservation:
        obs = super().step(action, timeout_s, **kw)
        if obs.reward:
            obs.reward = obs.reward * 0.5
        return obs


class EmptyAnswerScoresOne(SearchQAEnvironment):
    """The verifier that gave 1.0 to the empty string."""

    def step(self, action: SearchQAAction, timeout_s: float | None = None, **kw: Any) -> SearchQAObservation:
        obs = super().step(action, timeout_s, **kw)
        if action.tool == "answer" and not action.text.strip():
            obs.reward = 1.0
        return obs


class GoldenInMetadata(SearchQAEnvironment):
    """The golden answer placed in the prompt's metadata."""

    def reset(self, *args: Any, **kwargs: Any) -> SearchQAObservation:
        obs = super().reset(*args, **kwargs)
        assert self._tool.question is not None
        obs.metadata = {"hint": self._tool.question.golden_answers[0]}
        return obs


class UnseededShuffle(SearchQAEnvironment):
    """Passages shuffled by a generator no seed reaches."""

    def step(self, action: SearchQAAction, timeout_s: float | None = None, **kw: Any) -> SearchQAObservation:
        obs = super().step(action, timeout_s, **kw)
        if obs.passage_ids:
            order = list(range(len(obs.passage_ids)))
            random.SystemRandom().shuffle(order)
            obs.passage_ids = [obs.passage_ids[i] for i in order]
        return obs


class NoEpisodeId(SearchQAEnvironment):
    """A state without its episode id."""

    @property
    def state(self) -> SearchQAState:
        return self._state.model_copy(update={"episode_id": None}, deep=True)


class TaskDiscoveryTool(SearchQAAction):
    """A third tool that lists the questions."""

    tool: Literal["search", "answer", "list_questions"] = Field(
        description="search, answer, or list questions"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("check", "environment", "action"),
    [
        ("oracle", CappedOracle, None),
        ("floor", EmptyAnswerScoresOne, None),
        ("leakage", GoldenInMetadata, None),
        ("determinism", UnseededShuffle, None),
        ("state", NoEpisodeId, None),
        ("tools", None, TaskDiscoveryTool),
    ],
)
def test_each_check_fails_on_its_planted_defect(
    check: str, environment: type | None, action: type | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdicts = _verdicts(monkeypatch, environment, action, only=(check,))
    assert verdicts == {check: False}


def test_the_manifest_declares_the_bar_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    validation, text = read_validation(MANIFEST)
    assert (validation.reward_min, validation.reward_max, validation.floor_margin) == (0.0, 1.0, 0.1)
    bad = tmp_path / "openenv.yaml"
    bad.write_text("validation:\n  reward:\n    range: [1.0, 0.0]\n")
    with pytest.raises(ConfigError, match=r"openenv.yaml: validation.reward.range must be \[low, high\]"):
        read_validation(bad)
    with pytest.raises(ConfigError, match="unknown checks"):
        run_checks("http://127.0.0.1:9", SPEC, manifest=MANIFEST, only=("speed",))


@pytest.mark.slow
def test_the_floor_check_catches_sub_exact_match_scoring_a_candidate_list() -> None:
    """Under ``subem`` a list of candidates that holds the golden answer scores 1: the floor check says so."""
    from searchgym.app.openenv.server import create_searchqa_app
    from searchgym.server import ServerThread

    spec = EnvSpec(reward="subem")
    with ServerThread(create_searchqa_app(spec)) as srv:
        (result,) = run_checks(srv.url, spec, manifest=MANIFEST, questions=1, only=("floor",))
    assert not result.passed and "canary/candidate-list/" in result.detail and ": 1.0" in result.detail
    assert "empty-answer" not in result.detail
