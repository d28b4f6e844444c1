from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.tokenization import builtin_tokenizer, load_tokenizer


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_builtin_round_trips_any_unicode(text: str) -> None:
    tok = builtin_tokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")


def test_builtin_special_tokens_and_size() -> None:
    tok = load_tokenizer()
    assert tok is load_tokenizer("builtin")
    assert tok.vocab_size == 8192
    assert tok.eos_token_id is not None and tok.token_bytes[tok.eos_token_id] == b""


def test_transformers_tokenizer_agrees_with_builtin() -> None:
    tok = builtin_tokenizer()
    hf = tok.to_transformers()
    wrapped = load_tokenizer(hf)
    text = "Question: Who founded Lyku Works?\n<search> Lyku Works </search> é 🙂"
    assert wrapped.vocab_size == tok.vocab_size
    assert wrapped.encode(text) == tok.encode(text)
    assert wrapped.token_bytes == tok.token_bytes
    assert hf.decode(tok.encode(text)) == text
