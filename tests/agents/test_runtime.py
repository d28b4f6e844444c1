"""``agents/grpo/runtime.py``: what every training entry point shares."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from searchgym.agents.grpo.config import SFTConfig  # noqa: E402
from searchgym.agents.grpo.runtime import build_policy  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: --device cuda is valid here")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_usable_gpu_is_a_config_error(device: str) -> None:
    with pytest.raises(ConfigError, match=f"--device {device}") as caught:
        build_policy(SFTConfig(device=device, tiny_layers=1, tiny_hidden=32))
    if torch.version.cuda is None:  # the CPU build: the message says what to install, in one command
        assert "pip install torch --index-url https://download.pytorch.org/whl/cu" in str(caught.value)
        assert "constraints.txt" in str(caught.value)
