"""What the study tests share: a tiny protocol, and a writer of protocol files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

TINY_PROTOCOL = """
[study]
name = "tiny"
seeds = [0, 1]
control = "control"
runs = "runs"
summaries = "summaries"

[warmstart]
path = "warm/checkpoint.pt"
sha256 = "{sha256}"

[train]
steps = 2
max_turn_tokens = 8
questions_per_step = 2
group_size = 2
minibatch_size = 2
lr_schedule = "constant"
kl_coef = 0.0
entropy_coef = 0.0
probe_size = 2
onpolicy_probe_size = 2
probe_every = 1
ledger_size = 4
save_every = 1

[evaluation]
steps = [0, 1, 2]
questions = 2
batch = 2

[arms.control]
lr = 0.0
llds = "none"

[arms.grpo]
lr = 1e-3
llds = "none"
{extra_arms}
[definitions.learned]
kind = "window_gain"
steps = [1, 2]
at_least = 0.0

[definitions.collapse]
kind = "trailing_below"
width = 1
at_most = -0.5
from_step = 1

[[criteria]]
id = "C1"
name = "learn, then collapse"
kind = "seeds"
arms = ["grpo"]
when = ["learned", "collapse"]
at_least = 2
"""
"""A protocol of two arms, two seeds and two steps on a tiny model (``--max-turn-tokens 8``, 2 questions ×
group 2); the warm-start's digest and extra arms are filled in."""


@pytest.fixture
def write_protocol(tmp_path: Path) -> Callable[..., Path]:
    """Writes a protocol file into ``tmp_path`` (``TINY_PROTOCOL`` by default) and returns its path."""

    def write(
        text: str | None = None, *, sha256: str = "0" * 64, extra_arms: str = "", name: str = "p.toml"
    ) -> Path:
        path = tmp_path / name
        body = text if text is not None else TINY_PROTOCOL.format(sha256=sha256, extra_arms=extra_arms)
        path.write_text(body)
        return path

    return write
