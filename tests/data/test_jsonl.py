"""``searchgym/data/jsonl.py``: ``replace_on_success`` writes beside the file and lets one writer at a time at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchgym.data.jsonl import replace_on_success
from searchgym.errors import ConfigError


def test_a_second_writer_of_the_same_out_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    out.write_text("earlier\n")
    with replace_on_success(out) as partial:
        partial.write_text("first run\n")
        with pytest.raises(ConfigError, match=r"another run is writing .*t\.jsonl"), replace_on_success(out):
            pass
        assert out.read_text() == "earlier\n"
    assert out.read_text() == "first run\n"
