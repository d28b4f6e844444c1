"""Builds the built-in offline tokenizer shipped as ``searchgym/assets/tokenizer.json``.

A byte-level BPE (Hugging Face ``tokenizers``): every Unicode string encodes with no unknown token, because
the 256 byte symbols are in the base alphabet. It is trained on the text the environment produces — the
Search-R1 prompt and tool messages, and passages, questions and answers of generated worlds — plus, when
the folder exists, the real passages in ``../shared/data`` (so that real corpora do not explode into bytes).

Usage (from the repository root)::

    .venv/bin/python scripts/build_tokenizer.py [--vocab-size 8192] [--shared ../shared/data] [--out PATH]

The output is deterministic for the same inputs and ``tokenizers`` version.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from searchgym.data import generate_world
from searchgym.protocol import INVALID_TURN_MESSAGE, format_information, format_prompt
from searchgym.tokenization import EOS_TOKEN, PAD_TOKEN

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "searchgym" / "assets" / "tokenizer.json"


def world_texts(seeds: range) -> Iterator[str]:
    for seed in seeds:
        world = generate_world(seed=seed)
        for p in world.passages:
            yield format_information([(p.title, p.text)])
        for questions in world.splits.values():
            for q in questions:
                yield format_prompt(q.question)
                yield f"<think> I need {q.golden_answers[0]}. </think>\n<search> {q.question} </search>"
                yield f"<answer> {q.golden_answers[0]} </answer>"
    for _ in range(20):
        yield INVALID_TURN_MESSAGE


def shared_texts(root: Path) -> Iterator[str]:
    for corpus in sorted(root.glob("*/corpus.jsonl")):
        with corpus.open(encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["contents"]
    for split in sorted(root.glob("*/test.jsonl")):
        with split.open(encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                yield format_prompt(record["question"])
                yield " ".join(record["golden_answers"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--shared", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=[PAD_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts: list[str] = list(world_texts(range(3)))
    if args.shared.is_dir():
        texts.extend(shared_texts(args.shared))
    else:
        print(f"note: {args.shared} not found; training on generated worlds only")
    tokenizer.train_from_iterator(texts, trainer=trainer)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out))
    print(f"wrote {args.out} (vocab {tokenizer.get_vocab_size()}, trained on {len(texts)} texts)")


if __name__ == "__main__":
    main()
