"""``searchgym export``: a trained checkpoint as a standard Hugging Face model folder."""

from __future__ import annotations

import argparse

COMMAND = ("export",)
HELP = "write a trained checkpoint.pt as a Hugging Face folder (save_pretrained: model and tokenizer)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint.pt written by `train sft` or `train grpo`")
    parser.add_argument("out_dir", help="folder to write (loadable by AutoModelForCausalLM.from_pretrained)")
    parser.add_argument("--overwrite", action="store_true", help="replace the files of a non-empty folder")


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.training.export import export_pretrained

    out = export_pretrained(args.checkpoint, args.out_dir, overwrite=args.overwrite)
    print(f"wrote {out} (load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0
