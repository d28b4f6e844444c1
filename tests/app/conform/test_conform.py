"""``searchgym conform``: the scripted episodes, the native adapter, and one planted bug per check.

Each planted adapter is the native one with one bookkeeping bug of the kind the issue trackers of search-RL
stacks report; each must fail its check and no other.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the train extra is part of `all`: `make test` installs it")

from searchgym.agents.grpo.advantages import compute_advantages  # noqa: E402
from searchgym.agents.grpo.config import GRPOLossConfig, LLDSConfig  # noqa: E402
from searchgym.agents.grpo.losses import entropy_bonus, grpo_llds_loss, kl_penalty, policy_loss  # noqa: E402
from searchgym.agents.llm import token_logprobs  # noqa: E402
from searchgym.agents.training.rollout import RolloutBatch, pad_transcripts  # noqa: E402
from searchgym.app.conform.native import (  # noqa: E402
    native_adapter,
    native_batch,
    native_loss,
    train_batch,
)
from searchgym.app.conform.runner import (  # noqa: E402
    CHECKS,
    ConformError,
    Episode,
    LossOutput,
    Result,
    Scenario,
    ScriptedTurns,
    Setup,
    TrainBatch,
    Turn,
    load_adapter,
    prepare,
    run_conformance,
)
from searchgym.errors import ConfigError  # noqa: E402
from searchgym.protocol import Source  # noqa: E402

POLICY, TOOL, PROMPT = int(Source.POLICY), int(Source.TOOL), int(Source.PROMPT)


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return prepare()


def _failed(results: list[Result]) -> list[str]:
    return [r.name for r in results if r.status == "fail"]


def _detail(results: list[Result], name: str) -> str:
    return next(r.detail for r in results if r.name == name)


# -- the scripted episodes ---------------------------------------------------------------------------------


def test_scripted_episodes_exercise_what_the_checks_need(scenario: Scenario) -> None:
    main, oov, tok = scenario.main, scenario.out_of_vocabulary, scenario.tokenizer
    assert [ep.reward for ep in main] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [ep.group for ep in main] == [0] * 4 + [1] * 4
    assert max(len(ep.turns) for ep in main) == 3 and any(TOOL in ep.sources for ep in main)
    # Two turns were continued after their tag; the env kept the tag and dropped exactly the rest.
    cut = [(ep.label, pos, ids) for ep in main for pos, ids in ep.dropped]
    assert [label for label, _, _ in cut] == [
        "text after </search>, wrong answer",
        "text after </answer>, wrong",
    ]
    for _, _, ids in cut:
        assert list(ids) == list(scenario.junk)
    search_cut = main[3]
    assert tok.decode(list(search_cut.tokens[: search_cut.dropped[0][0]])).endswith("</search>")
    assert search_cut.sources[search_cut.dropped[0][0]] == TOOL  # the tool output follows the tag at once
    # The sampler's log-probs are the policy's, on the policy's tokens only.
    ep = main[1]
    ids = torch.tensor([list(ep.tokens)])
    logp, _ = token_logprobs(scenario.model, ids, torch.ones_like(ids), vocab_size=tok.vocab_size)
    policy = torch.tensor(ep.sources) == POLICY
    torch.testing.assert_close(torch.tensor(ep.logprobs)[policy], logp[0][policy], atol=1e-5, rtol=0)
    assert all(v == 0.0 for v, s in zip(ep.logprobs, ep.sources, strict=True) if s != POLICY)
    assert list(ep.turns[0].logprobs) == list(ep.logprobs[ep.starts[0] : ep.starts[0] + ep.turns[0].kept])
    # The last group: one id beyond the vocabulary, which the env refused.
    assert [e.refused is not None for e in oov] == [False, False, False, True]
    assert str(tok.vocab_size + 3) in (oov[3].refused or "") and tok.vocab_size + 3 in oov[3].turns[0].tokens


def test_text_after_a_tag_falls_back_to_ids_no_transcript_holds(scenario: Scenario) -> None:
    """A tokenizer that writes the default text after a tag with ids the transcripts use gets other ids."""
    from searchgym.app.conform.episodes import _unused_ids

    tok = scenario.tokenizer
    used = {t for ep in scenario.main for t in ep.tokens} | set(scenario.junk)
    ids = _unused_ids(tok, used, 6)
    assert len(set(ids)) == 6 and not set(ids) & used
    assert all(not set(tok.decode([i])) & set("<>/") for i in ids)


def test_scripted_turns_refuse_a_context_that_is_not_the_envs(scenario: Scenario) -> None:
    ep = scenario.main[0]
    turns = ScriptedTurns([ep])
    assert turns.turn(0, ep.tokens[: ep.starts[0]]) == ep.turns[0]
    with pytest.raises(ConformError, match="not the env's transcript"):
        turns.turn(0, ep.tokens[: ep.starts[1] - 1])


def test_native_stack_passes_every_check(scenario: Scenario) -> None:
    results = run_conformance(native_adapter, scenario)
    assert [r.name for r in results] == list(CHECKS)
    assert [r.status for r in results] == ["ok"] * len(CHECKS), [r.detail for r in results]
    assert "refused: InvalidActionError" in _detail(results, "vocabulary")
    assert "returned no entropies" not in _detail(results, "masks")  # the entropy term was checked too


def test_load_adapter_names_engines_and_refuses_the_rest() -> None:
    assert load_adapter("native") is native_adapter
    assert load_adapter("searchgym.app.conform.native:native_adapter") is native_adapter
    with pytest.raises(
        ConfigError, match=r"unknown engine 'nope'; choose one of \['native', 'trl', 'verl'\]"
    ):
        load_adapter("nope")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'"):
        load_adapter("no_such_module_xyz:adapter")
    with pytest.raises(ConfigError, match="has no callable 'missing'"):
        load_adapter("searchgym.app.conform.native:missing")


def test_cli_prints_one_json_line_per_check_and_refuses_an_unknown_engine(capsys: Any) -> None:
    from searchgym.app.cli import main

    assert main(["conform", "--engine", "native", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and [c["name"] for c in report["checks"]] == list(CHECKS)
    assert main(["conform", "--engine", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("searchgym: error: unknown engine 'nope'")


@pytest.mark.parametrize(("returned", "kind"), [("None", "NoneType"), ("{'tokens': []}", "dict")])
def test_an_adapter_returning_something_else_than_a_batch_is_one_line(
    tmp_path: Any, capsys: Any, returned: str, kind: str
) -> None:
    from searchgym.app.cli import main

    adapter = tmp_path / "my_stack.py"
    adapter.write_text(f"def adapter(episodes, setup):\n    return {returned}\n")
    assert main(["conform", "--engine", f"{adapter}:adapter"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and not captured.out, captured
    assert f"the adapter my_stack:adapter returned {kind}, not a TrainBatch" in err[0]


# -- planted bugs: the native stack with one bookkeeping error each ----------------------------------------


def _rows(batch: RolloutBatch) -> list[int]:
    return batch.attention_mask.sum(dim=1).tolist()


def _rebuild(
    batch: RolloutBatch, tokens: list[list[int]], sources: list[list[int]], logp: list[list[float]], pad: int
) -> RolloutBatch:
    ids, mask, src = pad_transcripts(tokens, sources, pad)
    old = torch.zeros(ids.shape)
    for i, row in enumerate(logp):
        old[i, : len(row)] = torch.tensor(row)
    return RolloutBatch(ids, mask, src, old, batch.rewards, batch.infos)


def _planted(
    rows: Callable[[RolloutBatch, Sequence[Episode], Setup], RolloutBatch] | None = None,
    loss: Callable[[RolloutBatch, torch.Tensor, Setup], LossOutput] = native_loss,
    advantages: Callable[[RolloutBatch, Setup], torch.Tensor] | None = None,
    aggregation: str = "token-mean",
) -> Callable[[Sequence[Episode], Setup], TrainBatch]:
    """The native adapter with its rows, loss or advantages replaced."""

    def adapter(episodes: Sequence[Episode], setup: Setup) -> TrainBatch:
        setup.model.eval()
        batch = native_batch(episodes, setup)
        if rows is not None:
            batch = rows(batch, episodes, setup)
        if advantages is None:
            adv = compute_advantages(batch.rewards, setup.group_size, "group")
        else:
            adv = advantages(batch, setup)
        out = train_batch(batch, adv, episodes, lambda: loss(batch, adv, setup), "grpo")
        out.aggregation = aggregation
        return out

    return adapter


def _shift_mask(batch: RolloutBatch, episodes: Sequence[Episode], setup: Setup) -> RolloutBatch:
    """The loss mask one token late: each policy run's first token untrained, the token after it trained."""
    src = batch.sources.clone()
    policy = batch.sources == POLICY
    late = torch.zeros_like(policy)
    late[:, 1:] = policy[:, :-1]
    src[policy & ~late] = TOOL
    src[late & batch.attention_mask.bool()] = POLICY
    return RolloutBatch(batch.tokens, batch.attention_mask, src, batch.logp_old, batch.rewards, batch.infos)


def _loss_reads_the_mask_late(batch: RolloutBatch, adv: torch.Tensor, setup: Setup) -> LossOutput:
    """The batch's mask is right, but the loss applies it one token late (the log-probs of every position
    computed, the mask indexed like the ids instead of like them)."""
    late = _shift_mask(batch, [], setup).loss_mask
    logp, _ = token_logprobs(
        setup.model, batch.tokens, batch.attention_mask, vocab_size=setup.tokenizer.vocab_size
    )
    loss, _ = grpo_llds_loss(
        logp, batch.logp_old, adv, late, GRPOLossConfig(kl_coef=0.0), LLDSConfig(gate=None)
    )
    return LossOutput(loss, logp)


def _kl_over_tool_tokens(batch: RolloutBatch, adv: torch.Tensor, setup: Setup) -> LossOutput:
    """The policy loss on policy tokens, but the KL over the whole response, tool output included."""
    vocab = setup.tokenizer.vocab_size
    response = (batch.sources != PROMPT) & batch.attention_mask.bool()
    logp, entropy = token_logprobs(
        setup.model,
        batch.tokens,
        batch.attention_mask,
        vocab_size=vocab,
        with_entropy=True,
        score_mask=response,
    )
    ent = entropy if setup.entropy_coef else None
    weights = GRPOLossConfig(kl_coef=0.0, entropy_coef=setup.entropy_coef)
    loss, _ = grpo_llds_loss(
        logp, batch.logp_old, adv, batch.loss_mask, weights, LLDSConfig(gate=None), entropy=ent
    )
    if setup.kl_coef:
        with torch.no_grad():
            ref, _ = token_logprobs(
                setup.reference, batch.tokens, batch.attention_mask, vocab_size=vocab, score_mask=response
            )
        kl, _ = kl_penalty(logp, ref, response)
        loss = loss + setup.kl_coef * kl
    return LossOutput(loss, logp, ent)


def _strip_earlier_thinking(batch: RolloutBatch, episodes: Sequence[Episode], setup: Setup) -> RolloutBatch:
    """A chat template's re-rendering: every turn but the last loses its <think> ... </think>."""
    tok = setup.tokenizer
    opening, closing = tok.encode(" <think>"), tok.encode(" </think>")
    rows = []
    for i, n in enumerate(_rows(batch)):
        ep = episodes[i]
        cut: set[int] = set()
        for start, turn in list(zip(ep.starts, ep.turns, strict=True))[:-1]:
            kept = list(turn.tokens[: turn.kept])
            if kept[: len(opening)] != opening:
                continue
            end = next(k for k in range(len(kept)) if kept[k : k + len(closing)] == closing) + len(closing)
            cut.update(range(start, start + end))
        keep = [p for p in range(n) if p not in cut]
        rows.append(keep)
    return _rebuild(
        batch,
        [[int(batch.tokens[i, p]) for p in keep] for i, keep in enumerate(rows)],
        [[int(batch.sources[i, p]) for p in keep] for i, keep in enumerate(rows)],
        [[float(batch.logp_old[i, p]) for p in keep] for i, keep in enumerate(rows)],
        tok.pad_token_id,
    )


def _keep_text_after_tags(batch: RolloutBatch, episodes: Sequence[Episode], setup: Setup) -> RolloutBatch:
    """A stack not stopped at the tag: what the sampler wrote after it stays in the turn, trained on."""
    tokens, sources, logp = [], [], []
    for i, n in enumerate(_rows(batch)):
        t, s, lp = batch.tokens[i, :n].tolist(), batch.sources[i, :n].tolist(), batch.logp_old[i, :n].tolist()
        ep = episodes[i]
        continued = [(start, turn) for start, turn in zip(ep.starts, ep.turns, strict=True) if ep.dropped]
        for start, turn in reversed(continued):
            if turn.kept < len(turn.tokens):
                pos, ids = start + turn.kept, list(turn.tokens[turn.kept :])
                t[pos:pos] = ids
                s[pos:pos] = [POLICY] * len(ids)
                lp[pos:pos] = list(turn.logprobs[turn.kept :])
        tokens.append(t)
        sources.append(s)
        logp.append(lp)
    return _rebuild(batch, tokens, sources, logp, setup.tokenizer.pad_token_id)


def _embed_out_of_vocabulary(episodes: Sequence[Episode], setup: Setup) -> TrainBatch:
    """Bypasses the env's refusal: the sampled id beyond the vocabulary goes into the row, trained on."""
    vocab, valid = setup.tokenizer.vocab_size, setup.tokenizer.encode(" x")[0]
    played, planted = [], []
    for ep in episodes:
        turns = []
        for k, turn in enumerate(ep.turns):
            for j, t in enumerate(turn.tokens):
                if t >= vocab:
                    planted.append((ep.index, ep.starts[k] + j, t))
            tokens = tuple(valid if t >= vocab else t for t in turn.tokens)
            turns.append(Turn(tokens, turn.logprobs, turn.kept))
        played.append(dataclasses.replace(ep, turns=tuple(turns)))
    setup.model.eval()
    batch = native_batch(played, setup)
    first = episodes[0].index
    for index, pos, t in planted:
        batch.tokens[index - first, pos] = t
    adv = compute_advantages(batch.rewards, setup.group_size, "group")
    return train_batch(batch, adv, episodes, lambda: native_loss(batch, adv, setup), "grpo")


def _sequence_mean(batch: RolloutBatch, adv: torch.Tensor, setup: Setup) -> LossOutput:
    """Each response's token mean, then the mean over responses (seq-mean-token-mean)."""
    vocab, mask = setup.tokenizer.vocab_size, batch.loss_mask
    logp, entropy = token_logprobs(
        setup.model, batch.tokens, batch.attention_mask, vocab_size=vocab, with_entropy=True, score_mask=mask
    )
    rows = [
        policy_loss(logp[i : i + 1], batch.logp_old[i : i + 1], adv[i : i + 1], mask[i : i + 1])[0]
        for i in range(len(batch))
    ]
    loss = torch.stack(rows).mean()
    if setup.kl_coef:
        with torch.no_grad():
            ref, _ = token_logprobs(setup.reference, batch.tokens, batch.attention_mask, vocab_size=vocab)
        loss = loss + setup.kl_coef * kl_penalty(logp, ref, mask)[0]
    if setup.entropy_coef:
        loss = loss - setup.entropy_coef * entropy_bonus(entropy, mask)[0]
    return LossOutput(loss, logp, entropy if setup.entropy_coef else None)


def _old_logprobs_one_token_off(
    batch: RolloutBatch, episodes: Sequence[Episode], setup: Setup
) -> RolloutBatch:
    """pi_old read one position late: token t gets the sampler's log-prob of token t - 1."""
    old = torch.zeros_like(batch.logp_old)
    old[:, 1:] = batch.logp_old[:, :-1]
    return RolloutBatch(batch.tokens, batch.attention_mask, batch.sources, old, batch.rewards, batch.infos)


def _batch_std(batch: RolloutBatch, setup: Setup) -> torch.Tensor:
    """Group-centred rewards over the whole batch's standard deviation, declared as GRPO's."""
    r = batch.rewards.view(-1, setup.group_size)
    return ((r - r.mean(dim=1, keepdim=True)) / (batch.rewards.std() + 1e-6)).flatten()


PLANTED: dict[str, tuple[Callable[[Sequence[Episode], Setup], TrainBatch], str, str]] = {
    "mask shifted by one": (_planted(rows=_shift_mask), "masks", "loss mask differs"),
    "loss reads the mask one token late": (
        _planted(loss=_loss_reads_the_mask_late),
        "masks",
        "one token late",
    ),
    "KL over tool tokens": (
        _planted(loss=_kl_over_tool_tokens),
        "masks",
        "covers tokens the policy did not write",
    ),
    "pi_old one token off": (_planted(rows=_old_logprobs_one_token_off), "log-probs", "one token off"),
    "text after the tag kept": (_planted(rows=_keep_text_after_tags), "stops", "are trained on"),
    "earlier <think> re-rendered away": (_planted(rows=_strip_earlier_thinking), "transcript", "<think>"),
    "id beyond the vocabulary embedded": (
        _embed_out_of_vocabulary,
        "vocabulary",
        "reached the model's embedding",
    ),
    "batch-normalised advantages": (_planted(advantages=_batch_std), "advantages", "grpo gives 0.866"),
    "sequence mean declared token mean": (
        _planted(loss=_sequence_mean),
        "aggregation",
        "each response weighs the same",
    ),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_each_planted_bug_fails_its_check_and_only_its_check(scenario: Scenario, bug: str) -> None:
    adapter, check, fragment = PLANTED[bug]
    results = run_conformance(adapter, scenario)
    assert _failed(results) == [check], [(r.name, r.status, r.detail) for r in results]
    assert fragment in _detail(results, check)


# -- TRL ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loss_type", "aggregation"), [("dapo", "token-mean"), ("grpo", "seq-mean-token-mean")]
)
def test_trl_stack_passes_every_check(loss_type: str, aggregation: str) -> None:
    """TRL's GRPOTrainer, fed by searchgym's rollout_func: its batch and loss conform; with loss_type grpo
    the measured aggregation is TRL's sequence mean, as declared."""
    pytest.importorskip("trl", reason="the trl extra is part of `all`: `make test` installs it")
    from searchgym.app.conform.trl import trl_adapter

    results = run_conformance(functools.partial(trl_adapter, loss_type=loss_type), prepare())
    assert [r.status for r in results] == ["ok"] * len(CHECKS), [r.detail for r in results]
    assert _detail(results, "aggregation").startswith(f"{aggregation}: ")
