"""One process of ``test_trl.py``'s two-process vLLM test, started by ``torch.distributed.run``.

Each process plays its own episodes through TRL's real ``VLLMGeneration.generate`` in server mode (gather
every process's prompts, generate on the main process, broadcast, slice ``[rank * n, (rank + 1) * n)``);
only the HTTP client is a fake. The fake answers a context at once when it holds process 0's question or
retrieved passages, and searches otherwise, so process 0 needs one turn and process 1 two, with
different numbers of episodes. The answer it writes is the length of the context it was given, so an
episode that received another context's completion is caught. Usage: ``trl_vllm_worker.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from accelerate import Accelerator
from trl.generation.vllm_generation import VLLMGeneration

from searchgym.agents.integrations.trl import SearchQARollout
from searchgym.agents.integrations.trl_train import end_processes
from searchgym.envs.spec import EnvSpec
from searchgym.tokenization import load_tokenizer

ENV = {"max_turn_tokens": 16, "max_context_tokens": 320, "topk": 1, "max_turns": 3}


class FakeClient:
    """Stands in for TRL's ``VLLMClient`` (the HTTP client of ``trl vllm-serve``)."""

    def __init__(self, tok: Any, direct: str) -> None:
        self.tok = tok
        self.direct = direct

    def generate(self, prompts: list[list[int]], n: int = 1, **_: Any) -> dict[str, Any]:
        assert n == 1
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            if self.direct in text or "Doc 1(Title:" in text:
                out.append(self.tok.encode(f"<answer> {len(ids)} </answer> trailing"))
            else:
                out.append(self.tok.encode("<search> x </search>"))
        return {
            "prompt_ids": prompts,
            "completion_ids": out,
            "logprobs": [[[-0.25]] * len(c) for c in out],
            "logprob_token_ids": None,
        }


def main(out_dir: str) -> None:
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    tok = load_tokenizer(None)
    rollout = SearchQARollout(EnvSpec(**ENV), tok, seed=rank)
    questions = rollout.env(1).questions
    direct = questions[0]

    class ServerGeneration(VLLMGeneration):
        def _init_vllm(self) -> None:
            self.vllm_client = FakeClient(tok, direct.question)

    generation = ServerGeneration(None, accelerator, tok.to_transformers(), mode="server")
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=generation, accelerator=accelerator)
    prompts = [direct.id] * 2 if rank == 0 else [questions[1].id] * 3
    out = rollout(prompts, trainer)
    assert rollout.last_batch is not None
    checks = []
    for i, info in enumerate(rollout.last_batch.infos):
        answer = tok.encode(f"<answer> {info['answer']} </answer>")
        length = len(out["prompt_ids"][i]) + len(out["completion_ids"][i])
        # The answer names the length of the context it was generated for: the transcript before it.
        checks.append(int(info["answer"]) == length - len(answer))
    record = {
        "rank": rank,
        "episodes": len(out["completion_ids"]),
        "searches": [info["searches"] for info in rollout.last_batch.infos],
        "answers_match_contexts": checks,
        "prompt_lengths": [len(p) for p in out["prompt_ids"]],
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])
