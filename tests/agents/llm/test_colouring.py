"""``sequence_logprobs``: the per-token log-probs ``searchgym view`` colours policy tokens by."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.llm import LLMPolicy  # noqa: E402
from searchgym.agents.llm.colouring import sequence_logprobs  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402


@pytest.fixture(scope="module")
def policy() -> LLMPolicy:
    return LLMPolicy.tiny()


def test_masked_tokens_get_their_log_probs_whatever_the_batching(policy: LLMPolicy) -> None:
    tok = policy.tokenizer
    sequences = [
        tok.encode(t) for t in ("Question: who? <search> x </search>", "a b", "one two three four five")
    ]
    masks = [[i % 2 == 1 for i in range(len(s))] for s in sequences]
    alone = sequence_logprobs(policy, sequences, masks, batch_size=1)
    together = sequence_logprobs(policy, sequences, masks, batch_size=3)
    for seq, mask, a, b in zip(sequences, masks, alone, together, strict=True):
        assert a.shape == (len(seq),) and np.allclose(a, b, atol=1e-5)
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([seq])).logits[0, :-1, : tok.vocab_size]
        expected = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
        assert np.allclose(a[1:][mask[1:]], expected.numpy()[mask[1:]], atol=1e-4)
        assert (a[~np.array(mask)] == 0).all()


def test_masks_must_match_the_sequences(policy: LLMPolicy) -> None:
    with pytest.raises(ConfigError, match="one mask flag per token"):
        sequence_logprobs(policy, [[1, 2, 3]], [[True]])
    with pytest.raises(ConfigError, match="batch_size"):
        sequence_logprobs(policy, [[1, 2]], [[True, True]], batch_size=0)
    assert sequence_logprobs(policy, [], []) == []
