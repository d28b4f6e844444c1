"""One fixed set of trajectories scores the same through every door: the Gymnasium env, the TRL tool env,
OpenEnv's client against a live server, and the verifiers environment's episode loop."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from searchgym.app.hub.parity import DOORS, Outcome, build_trajectories, compare, group_specs, play_all
from searchgym.envs import EnvSpec

from ...conftest import HOTPOT, require

SPEC = EnvSpec()


@pytest.fixture(scope="module")
def trajectories() -> list[Any]:
    return build_trajectories(SPEC)


@contextlib.contextmanager
def _servers(spec: EnvSpec) -> Iterator[dict[str, str]]:
    """One OpenEnv server per group of trajectories (``spec``, and ``spec`` with faults)."""
    pytest.importorskip("openenv", reason="OpenEnv is in the dev extra")
    from searchgym.app.openenv.server import create_searchqa_app
    from searchgym.server import ServerThread

    with contextlib.ExitStack() as stack:
        yield {
            group: stack.enter_context(ServerThread(create_searchqa_app(spec))).url
            for group, spec in group_specs(spec).items()
        }


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with _servers(SPEC) as found:
        yield found


@pytest.fixture(scope="module")
def outcomes(trajectories: list[Any], urls: dict[str, str]) -> dict[str, dict[str, Outcome]]:
    return play_all(SPEC, trajectories, urls)


def test_the_set_covers_every_kind(trajectories: list[Any]) -> None:
    assert len(trajectories) >= 50 and len({t.name for t in trajectories}) == len(trajectories)
    kinds = Counter(
        t.name.split("/")[0] if not t.name.startswith("canary/") else t.name.rsplit("/", 1)[0]
        for t in trajectories
    )
    for kind in (
        "oracle",
        "shortcut",
        "search-then-guess",
        "answer-at-once",
        "malformed-tag",
        "empty-search",
        "normalised-answer",
        "oracle-under-faults",
        "canary/empty-answer",
        "canary/no-answer",
        "canary/candidate-list",
        "canary/answer-in-query",
    ):
        assert kinds[kind] >= 3, (kind, kinds)


@pytest.mark.slow
def test_every_door_gives_every_trajectory_the_same_reward_and_end(
    outcomes: dict[str, dict[str, Outcome]], trajectories: list[Any]
) -> None:
    assert set(outcomes) == set(DOORS)
    assert compare(outcomes) == []
    gym = outcomes["gym"]
    # The set means something: the oracle and the golden answer score 1, every canary 0, the budget ends.
    oracle = [gym[t.name] for t in trajectories if t.name.startswith("oracle/")]
    assert all((o.reward, o.end) == (1.0, "answered") for o in oracle)
    assert all(gym[t.name].reward == 0.0 for t in trajectories if t.name.startswith("canary/"))
    assert all(gym[t.name].end == "turn_budget" for t in trajectories if "no-answer" in t.name)
    assert all(gym[t.name].reward == 1.0 for t in trajectories if t.name.startswith(("malformed", "normal")))
    # A search with an empty query (blank, alternately) runs no retrieval on any door: the TRL tool env
    # refuses it, the others read it as a turn that calls no tool; the golden answer after it scores 1.
    empty = [t for t in trajectories if t.name.startswith("empty-search/")]
    assert {t.turns[0][1] for t in empty} == {"", " "}
    assert all((gym[t.name].reward, len(gym[t.name].hits)) == (1.0, 1) for t in empty)


@pytest.mark.slow
def test_the_faults_fired_and_every_door_drew_the_same(
    outcomes: dict[str, dict[str, Outcome]], trajectories: list[Any]
) -> None:
    """The faulted group's searches returned other passages than the same moves without faults (so the
    agreement above covers the fault draws), and the doors agree on those passages."""
    faulted = [t for t in trajectories if t.group == "faults"]
    plain = play_all(SPEC, [dataclasses.replace(t, group="default") for t in faulted], doors=("gym",))["gym"]
    assert any(plain[t.name].hits != outcomes["gym"][t.name].hits for t in faulted)
    assert all(outcomes[door][t.name].hits == outcomes["gym"][t.name].hits for door in DOORS for t in faulted)


def _perturb(door: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Moves ``door``'s reward by 0.5 on every episode."""
    if door == "trl":
        from searchgym.agents.integrations.trl_env import SearchQAToolEnv

        original = SearchQAToolEnv.get_reward
        monkeypatch.setattr(SearchQAToolEnv, "get_reward", lambda self: original(self) + 0.5)
        return
    from searchgym.app.hub import replies

    play = replies.play_conversation

    async def moved(*args: Any, **kwargs: Any) -> Any:
        turn = await play(*args, **kwargs)
        return None if turn is None else dataclasses.replace(turn, reward=turn.reward + 0.5)

    monkeypatch.setattr(replies, "play_conversation", moved)


@pytest.mark.slow
@pytest.mark.parametrize("door", ["trl", "verifiers"])
def test_a_perturbed_door_is_named_with_the_trajectory_and_both_values(
    door: str, trajectories: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One door's reward moved by 0.5 on every episode: the comparison names that door (only), each
    trajectory and both values."""
    some = trajectories[:6]
    want = play_all(SPEC, some, doors=("gym",))["gym"]
    _perturb(door, monkeypatch)
    lines = compare(play_all(SPEC, some, doors=("gym", "trl", "verifiers")))
    assert len(lines) == len(some) and all(line.startswith(f"{door}: ") for line in lines)
    for t in some:
        assert (
            f"{door}: trajectory {t.name}: reward {want[t.name].reward + 0.5}, gym {want[t.name].reward}"
            in lines
        )


@pytest.mark.slow
def test_every_door_agrees_on_a_shared_data_folder() -> None:
    """The same set built on HotpotQA's test split (its BM25 index, its questions): every door agrees."""
    spec = EnvSpec(dataset=str(require(HOTPOT)), split="test")
    trajectories = build_trajectories(spec)
    assert len(trajectories) >= 50
    with _servers(spec) as found:
        outcomes = play_all(spec, trajectories, found)
    assert set(outcomes) == set(DOORS) and compare(outcomes) == []
    gym = outcomes["gym"]
    assert all(gym[t.name].reward == 1.0 for t in trajectories if t.name.startswith("oracle"))
    assert all(gym[t.name].reward == 0.0 for t in trajectories if t.name.startswith("canary/"))
