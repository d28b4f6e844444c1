"""The checks of :func:`~searchgym.app.conform.runner.run_conformance`, one function each.

Each compares one build of a :class:`~searchgym.app.conform.runner.TrainBatch` (and, where it needs
one, its loss evaluated with gradients) with the episodes the environment recorded, and returns one
:class:`~searchgym.app.conform.runner.Result`: ``ok``, or ``fail`` with what was found, where (row,
token, the token's text) and what to change. A row is compared with its episode through the alignment of
the two token sequences, so one check's finding (a token kept after a tag, a re-rendered turn) does not
shift every later token into another check's.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from searchgym.protocol import Source
from searchgym.tokenization import Tokenizer

from .adapter import Built, LossOutput, Result, TrainBatch
from .episodes import Episode

__all__ = [
    "check_logprobs",
    "check_masks",
    "check_stops",
    "check_transcript",
    "check_vocabulary",
]

#: Largest gap accepted between two float32 log-probabilities of the same token in the same context.
LOGP_TOLERANCE = 1e-4
#: Largest relative spread accepted between measured and declared token weights (float32 gradients).
WEIGHT_TOLERANCE = 1e-3
#: Tokens whose ratio is this far from 1 (in log) are left out of the weight measurement.
RATIO_WINDOW = 0.1

_SOURCES = {int(s): s.name.lower() for s in Source}
_POLICY = int(Source.POLICY)

MASK_FIX = (
    "build the loss mask from the env's per-token sources (1 exactly where sources == Source.POLICY) and use "
    "that one mask in every term: policy loss, KL and entropy"
)
LOGP_FIX = (
    "score token t with the logits at position t - 1, over the vocabulary and at the temperature the sampler "
    "used, and take pi_old at the same positions"
)
STOP_FIX = (
    "end each turn at the token where its closing tag completes (the env's consumed count) and drop what the "
    "sampler wrote after it; stop strings alone can leave it in"
)
TRANSCRIPT_FIX = (
    "train on the ids the sampler produced and the tool ids the env returned, as they are; do not decode and "
    "re-render the conversation (a chat template may drop earlier turns' <think> or re-tokenise across turns)"
)
VOCAB_FIX = (
    "refuse an id beyond the tokenizer's vocabulary when it is sampled (naming it), or mask it out of the loss "
    "and replace it before the forward pass"
)


# -- shared helpers --------------------------------------------------------------------------------------


@dataclass
class _Row:
    """A batch row next to its episode: the aligned positions, and where the row first differs."""

    index: int
    episode: Episode
    tokens: list[int]
    mask: list[int]
    old: list[float]
    pairs: list[tuple[int, int]]  # (position in the episode, position in the row) of identical tokens
    diverge: int  # first position where the row and the episode differ (their common length if none)
    ops: list[tuple[str, int, int, int, int]]  # difflib's opcodes other than "equal", slid back


def _rows(batch: TrainBatch, episodes: Sequence[Episode]) -> list[_Row]:
    by_index = {ep.index: ep for ep in episodes}
    rows = []
    for i, index in enumerate(batch.episodes):
        ep = by_index.get(index)
        if ep is None:
            continue
        tokens = [int(t) for t in batch.tokens[i]]
        matcher = difflib.SequenceMatcher(None, list(ep.tokens), tokens, autojunk=False)
        pairs = [(a + k, b + k) for a, b, n in matcher.get_matching_blocks() for k in range(n)]
        ops = [_slide(list(ep.tokens), tokens, op) for op in matcher.get_opcodes() if op[0] != "equal"]
        diverge = min(len(ep.tokens), len(tokens))
        if ops:
            diverge = min(diverge, ops[0][1], ops[0][3])
        mask = [int(m) for m in batch.loss_mask[i]]
        old = [float(x) for x in batch.old_logp[i]]
        rows.append(_Row(i, ep, tokens, mask, old, pairs, diverge, ops))
    return rows


def _slide(
    env: list[int], row: list[int], op: tuple[str, int, int, int, int]
) -> tuple[str, int, int, int, int]:
    """A deletion or insertion slid back as far as the tokens allow: dropping ``' <think> … </think>'`` before
    ``' <search>'`` aligns as well after the first ``' <'``; slid back, no token is taken as unchanged when its
    context is not."""
    tag, i1, i2, j1, j2 = op
    if tag == "delete":
        while i1 > 0 and env[i1 - 1] == env[i2 - 1]:
            i1, i2, j1, j2 = i1 - 1, i2 - 1, j1 - 1, j2 - 1
    elif tag == "insert":
        while j1 > 0 and row[j1 - 1] == row[j2 - 1]:
            i1, i2, j1, j2 = i1 - 1, i2 - 1, j1 - 1, j2 - 1
    return tag, i1, i2, j1, j2


def _layout_problem(batch: TrainBatch) -> str | None:
    n = len(batch.tokens)
    for name, values in (
        ("loss_mask", batch.loss_mask),
        ("old_logp", batch.old_logp),
        ("advantages", batch.advantages),
        ("episodes", batch.episodes),
    ):
        if len(values) != n:
            return f"the batch has {n} rows of tokens but {len(values)} of {name}"
    for i, tokens in enumerate(batch.tokens):
        if len(batch.loss_mask[i]) != len(tokens) or len(batch.old_logp[i]) != len(tokens):
            return f"row {i} has {len(tokens)} tokens but a loss mask or old_logp of another length"
    return None


def failed_build(name: str, built: Built) -> Result | None:
    """The result of a check that cannot run: the adapter raised, or returned a malformed batch."""
    if built.error is not None:
        return Result(
            name, "fail", f"the adapter raised while building the batch: {_error(built.error)}", None
        )
    assert built.batch is not None
    problem = _layout_problem(built.batch)
    if problem:
        return Result(name, "fail", problem, "return one entry per token of each row (TrainBatch)")
    return None


def failed_loss(name: str, built: Built) -> Result | None:
    if built.loss_error is not None:
        return Result(name, "fail", f"the batch's loss failed: {_error(built.loss_error)}", None)
    return None


def _error(e: BaseException, limit: int = 200) -> str:
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text if len(text) <= limit else text[: limit - 1] + '…'}"


def by_position(
    values: Tensor, offset: Sequence[int] | None, lengths: Sequence[int]
) -> tuple[list[np.ndarray], float]:
    """Per row, the value at each transcript position (``nan`` where ``values`` has none), and the largest
    ``|value|`` among the entries that fall outside every transcript (padding)."""
    v = values.detach().float().cpu().numpy()
    if v.ndim != 2 or v.shape[0] != len(lengths):
        raise ValueError(f"the loss's log-probs have shape {tuple(v.shape)}, expected ({len(lengths)}, T)")
    out, stray = [], 0.0
    js = np.arange(v.shape[1])
    for i, n in enumerate(lengths):
        positions = js + (int(offset[i]) if offset is not None else 0)
        inside = (positions >= 0) & (positions < n)
        row = np.full(n, np.nan)
        row[positions[inside]] = v[i, inside]
        out.append(row)
        if (~inside).any():
            stray = max(stray, float(np.abs(v[i, ~inside]).max()))
    return out, stray


def _text(tok: Tokenizer, ids: Sequence[int], limit: int = 40) -> str:
    text = tok.decode([int(i) for i in ids if 0 <= int(i) < tok.vocab_size])
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _where(row: _Row, position: int, tok: Tokenizer) -> str:
    return f"row {row.index} ({row.episode.label}), token {position} {_text(tok, row.tokens[position : position + 1])}"


def row_advantage(batch: TrainBatch, row: int) -> float | None:
    """A row's advantage: its value, or its per-token value where the row is trained (``None`` if untrained);
    ``nan`` when the per-token values differ inside the row."""
    value = batch.advantages[row]
    if not isinstance(value, Sequence):
        return float(value)
    trained = [float(a) for a, m in zip(value, batch.loss_mask[row], strict=False) if m]
    if not trained:
        return None
    return trained[0] if max(trained) - min(trained) <= 1e-6 else math.nan


# -- the checks --------------------------------------------------------------------------------------------


def check_masks(built: Built, episodes: Sequence[Episode], tok: Tokenizer) -> Result:
    """Prompt and tool tokens: loss mask 0, and exactly zero gradient through the loss's log-probs and
    entropies (a KL or entropy term over them has one: the reference differs from the policy)."""
    name = "masks"
    failed = failed_build(name, built)
    if failed:
        return failed
    assert built.batch is not None
    rows = _rows(built.batch, episodes)
    wrong = [
        (r, p, e) for r in rows for e, p in r.pairs if bool(r.mask[p]) != (r.episode.sources[e] == _POLICY)
    ]
    if wrong:
        r, p, e = wrong[0]
        source = _SOURCES[r.episode.sources[e]]
        return Result(
            name,
            "fail",
            f"the loss mask differs from the env's policy tokens at {len(wrong)} tokens, first at "
            f"{_where(r, p, tok)}: a {source} token with mask {r.mask[p]}",
            MASK_FIX,
        )
    failed = failed_loss(name, built)
    if failed:
        return failed
    assert built.loss is not None and built.logp_grad is not None
    out: LossOutput = built.loss
    lengths = [len(r) for r in built.batch.tokens]
    terms = [("log-prob", built.logp_grad)]
    if built.entropy_grad is not None:
        terms.append(("entropy", built.entropy_grad))
    leaks: list[
        tuple[str, _Row | None, int, int, float]
    ] = []  # (term, row, position, env position, gradient)
    ignored: list[tuple[_Row, int]] = []
    trained = other = 0
    logp_grad: list[np.ndarray] = []
    for term, grad in terms:
        by_pos, stray = by_position(grad, out.offset, lengths)
        if term == "log-prob":
            logp_grad = by_pos
        for r in rows:
            moves = row_advantage(built.batch, r.index)
            for e, p in r.pairs:
                g = by_pos[r.index][p]
                if np.isnan(g):
                    continue
                policy = r.episode.sources[e] == _POLICY
                if not policy and g != 0.0:
                    leaks.append((term, r, p, e, float(g)))
                if term == "log-prob":
                    trained += policy
                    other += not policy
                    if policy and g == 0.0 and moves is not None and abs(moves) > 1e-6:
                        ignored.append((r, p))
        if stray:
            leaks.append((term, None, -1, -1, stray))  # padding
    if leaks:
        term, row, p, e, g = next((leak for leak in leaks if leak[1] is not None), leaks[0])
        shift = _shift(rows, logp_grad)
        if row is None:
            found = f"the {term}s of padding positions get gradient {g:.3g}"
        else:
            source = _SOURCES[row.episode.sources[e]]
            found = f"gradient {g:.3g} reaches the {term} of {_where(row, p, tok)}, a {source} token"
        if shift:
            why = (
                f"the loss trains each policy token's neighbour, one token {shift}: index the mask as the "
                "log-probs are indexed"
            )
        else:
            why = "a term of the loss (KL, entropy, or the policy loss through another mask) covers tokens the policy did not write"
        return Result(name, "fail", f"{found}: {why}", MASK_FIX)
    if ignored:
        r, p = ignored[0]
        return Result(
            name,
            "fail",
            f"the loss ignores {len(ignored)} trained policy tokens (zero gradient although A != 0), first "
            f"{_where(r, p, tok)}",
            MASK_FIX,
        )
    if not trained:
        return Result(name, "fail", "the loss's log-probs cover no policy token", MASK_FIX)
    entropy = (
        ""
        if built.entropy_grad is not None
        else "; it returned no entropies, so an entropy term is not checked"
    )
    return Result(
        name,
        "ok",
        f"loss mask 1 on exactly the {trained} policy tokens; exactly zero gradient on the {other} prompt and "
        f"tool tokens the loss scores, with the KL and entropy coefficients on{entropy}",
    )


def _shift(rows: Sequence[_Row], grad: Sequence[np.ndarray]) -> str | None:
    """``"late"`` or ``"early"`` when, in every row, only tokens one after (before) a policy token get a
    gradient (a clipped token may get none), and some of them are not policy tokens."""
    for delta, word in ((1, "late"), (-1, "early")):
        beside = False
        for r in rows:
            g = grad[r.index]
            moved = {p for p in range(len(g)) if not np.isnan(g[p]) and g[p] != 0.0}
            policy = {p for e, p in r.pairs if r.episode.sources[e] == _POLICY}
            if not moved <= {p + delta for p in policy}:
                break
            beside = beside or bool(moved - policy)
        else:
            if beside:
                return word
    return None


def _shift_hint(value: float, reference: Sequence[float], position: int) -> str:
    for delta in (-1, 1):
        q = position + delta
        if 0 <= q < len(reference) and abs(reference[q] - value) <= LOGP_TOLERANCE:
            return f" (it is token {q}'s: one token off)"
    return ""


def check_logprobs(built: Built, episodes: Sequence[Episode], tok: Tokenizer) -> Result:
    """The loss's log-prob of each trained policy token is the sampler's, so is ``pi_old``'s, and the ratio
    is 1.

    Judged on the policy tokens the stack trains on before its row first differs from the episode (a
    log-prob depends on its context; which tokens are trained is the ``masks`` check's).
    """
    name = "log-probs"
    failed = failed_build(name, built) or failed_loss(name, built)
    if failed:
        return failed
    assert built.batch is not None and built.loss is not None
    rows = _rows(built.batch, episodes)
    values, _ = by_position(built.loss.logp, built.loss.offset, [len(r) for r in built.batch.tokens])
    judged, worst = 0, 0.0
    for r in rows:
        sampled = r.episode.logprobs
        for p in range(r.diverge):
            if r.episode.sources[p] != _POLICY or not r.mask[p]:
                continue
            judged += 1
            lp, old = values[r.index][p], r.old[p]
            if np.isnan(lp):
                return Result(
                    name,
                    "fail",
                    f"the loss has no log-prob for the policy token at {_where(r, p, tok)}",
                    LOGP_FIX,
                )
            if abs(lp - sampled[p]) > LOGP_TOLERANCE:
                return Result(
                    name,
                    "fail",
                    f"the loss's log-prob of {_where(r, p, tok)} is {lp:.5f}, the sampler's "
                    f"{sampled[p]:.5f}{_shift_hint(lp, sampled, p)}",
                    LOGP_FIX,
                )
            if abs(old - sampled[p]) > LOGP_TOLERANCE:
                return Result(
                    name,
                    "fail",
                    f"pi_old of {_where(r, p, tok)} is {old:.5f}, the sampler's {sampled[p]:.5f}"
                    f"{_shift_hint(old, sampled, p)}; the ratio at the first update is {math.exp(lp - old):.4f}, not 1",
                    LOGP_FIX,
                )
            worst = max(worst, abs(lp - old))
    if not judged:
        return Result(
            name, "skip", "no trained policy token whose row matches its episode up to it (see transcript)"
        )
    return Result(
        name,
        "ok",
        f"{judged} policy tokens: the loss's log-probs and pi_old are the sampler's (within {LOGP_TOLERANCE:g}); "
        f"largest |log ratio| at the first update {worst:.1e}",
    )


def check_stops(built: Built, episodes: Sequence[Episode], tok: Tokenizer, junk: Sequence[int]) -> Result:
    """No id the sampler wrote after a turn's closing tag is in a row (trained, or kept as context)."""
    name = "stops"
    failed = failed_build(name, built)
    if failed:
        return failed
    assert built.batch is not None
    after = set(junk)
    rows = _rows(built.batch, episodes)
    cut = [(r, pos, ids) for r in rows for pos, ids in r.episode.dropped]
    if not cut:
        return Result(name, "skip", "no row holds a turn the sampler continued after its closing tag")
    for r in rows:
        kept = [p for p, t in enumerate(r.tokens) if t in after]
        if kept:
            trained = any(r.mask[p] for p in kept)
            start = r.episode.starts[0] if r.episode.starts else 0
            tag = next(
                (_text(tok, r.episode.tokens[max(start, pos - 3) : pos]) for pos, _ in r.episode.dropped),
                "''",
            )
            how = "trained on (loss mask 1)" if trained else "kept as context (loss mask 0)"
            return Result(
                name,
                "fail",
                f"row {r.index} ({r.episode.label}): {len(kept)} tokens the sampler wrote after {tag} "
                f"({_text(tok, [r.tokens[p] for p in kept])}, from token {kept[0]}) are {how}",
                STOP_FIX,
            )
    dropped = sum(len(ids) for _, _, ids in cut)
    return Result(
        name,
        "ok",
        f"{len(cut)} turns cut at their closing tag: the {dropped} tokens sampled after them are neither trained "
        "on nor kept as context",
    )


def check_transcript(
    built: Built, episodes: Sequence[Episode], tok: Tokenizer, junk: Sequence[int]
) -> Result:
    """Every episode has one row, and each row is its episode's transcript, token for token (what the sampler
    wrote after a tag is the ``stops`` check's)."""
    name = "transcript"
    failed = failed_build(name, built)
    if failed:
        return failed
    assert built.batch is not None
    counts = Counter(built.batch.episodes)
    for ep in episodes:
        if counts[ep.index] != 1:
            return Result(
                name,
                "fail",
                f"episode {ep.index} ({ep.label}) has {counts[ep.index]} rows in the batch, not 1",
                "return one row per episode, with its index in TrainBatch.episodes",
            )
    after = set(junk)
    for r in _rows(built.batch, episodes):
        for tag, i1, i2, j1, j2 in r.ops:
            if tag == "insert" and all(t in after for t in r.tokens[j1:j2]):
                continue
            before = _text(tok, r.episode.tokens[max(0, i1 - 8) : i1], 30)
            return Result(
                name,
                "fail",
                f"row {r.index} ({r.episode.label}) differs from the sampled transcript at token {i1}: after "
                f"{before} the sampler and env have {_text(tok, r.episode.tokens[i1:i2])}, the stack trains on "
                f"{_text(tok, r.tokens[j1:j2])}",
                TRANSCRIPT_FIX,
            )
    total = sum(len(ep.tokens) for ep in episodes)
    return Result(
        name, "ok", f"{len(episodes)} rows are their episodes' transcripts, token for token ({total} tokens)"
    )


def check_vocabulary(built: Built, episodes: Sequence[Episode], tok: Tokenizer) -> Result:
    """An id beyond the vocabulary is refused (an error naming it) or masked, and never embedded."""
    name = "vocabulary"
    oov = tok.vocab_size + 3
    if built.embedded:
        failure = built.error or built.loss_error
        crashed = f", and the forward failed ({_error(failure)})" if failure is not None else ""
        return Result(
            name,
            "fail",
            f"id {built.embedded[0]}, beyond the {tok.vocab_size}-id vocabulary, reached the model's "
            f"embedding{crashed}",
            VOCAB_FIX,
        )
    if built.error is not None:
        if str(oov) in str(built.error):
            return Result(name, "ok", f"refused: {_error(built.error)}")
        return Result(
            name,
            "fail",
            f"the group with id {oov} (beyond the vocabulary) failed with an error that does not name it: "
            f"{_error(built.error)}",
            VOCAB_FIX,
        )
    failed = failed_build(name, built) or failed_loss(name, built)
    if failed:
        return failed
    assert built.batch is not None
    for i, tokens in enumerate(built.batch.tokens):
        for p, t in enumerate(tokens):
            if t >= tok.vocab_size and built.batch.loss_mask[i][p]:
                return Result(
                    name, "fail", f"id {t} (row {i}, token {p}) is trained on (loss mask 1)", VOCAB_FIX
                )
    held = any(t >= tok.vocab_size for row in built.batch.tokens for t in row)
    if held:
        return Result(name, "ok", f"masked: id {oov} is in the batch with loss mask 0 and never embedded")
    return Result(
        name, "ok", f"dropped: no row holds id {oov}, and nothing beyond the vocabulary was embedded"
    )
