import os
import subprocess
import sys
from pathlib import Path

import pytest
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


def test_local_path_and_chat_template(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gymnasium as gym

    import searchgym  # noqa: F401

    hf = builtin_tokenizer().to_transformers()
    hf.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    hf.save_pretrained(tmp_path / "tok")
    env = gym.make("SearchQA-v0", tokenizer=str(tmp_path / "tok"), prompt_style="chat")
    obs, info = env.reset(seed=0)
    tok = env.unwrapped.tokenizer
    text = tok.decode(obs["tokens"][: int(obs["length"][0])])
    assert text.startswith("<|user|>Answer the given question.")
    assert text.endswith(f"Question: {info['question']}\n<|assistant|>")


def test_sentencepiece_style_tokenizer_detects_tags() -> None:
    import gymnasium as gym
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    import searchgym  # noqa: F401
    from searchgym.protocol import format_prompt

    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["</s>", *alphabet], show_progress=False)
    backend.train_from_iterator(
        [format_prompt("Who founded Lyku Works?"), "<search> q </search> <answer> a </answer>"] * 20, trainer
    )
    tok = load_tokenizer(backend)
    ids = tok.encode("<search> Lyku Works </search>")
    assert tok.decode(ids).strip() == "<search> Lyku Works </search>"
    env = gym.make("SearchQA-v0", tokenizer=backend, max_context_tokens=4096)
    env.reset(seed=0)
    for t in ids:
        obs, r, term, trunc, info = env.step(t)
    assert info["turn_end"] and info["queries"] == ["Lyku Works"]


def test_an_unavailable_hub_tokenizer_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = [
        sys.executable,
        "-m",
        "searchgym.app.cli",
        "eval",
        "--agent",
        "random",
        "--episodes",
        "1",
        "--no-progress",
    ]
    proc = subprocess.run(
        [*argv, "--tokenizer", "no-such-org/no-such-tokenizer"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert "not available offline" in lines[0] and "no-such-org/no-such-tokenizer" in lines[0]
