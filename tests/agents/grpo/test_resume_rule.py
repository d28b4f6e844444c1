"""Resume's rule, in one place: the options a resumed run may change are :data:`RESUMABLE_OPTIONS`, and that
set is what docs/security.md lists; every other option of ``train grpo`` is refused by name."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from searchgym.agents.grpo.config import GRPOConfig
from searchgym.agents.training.run import RESUMABLE_OPTIONS, check_resume_config
from searchgym.errors import ConfigError
from searchgym.options import flat_values

ROOT = Path(__file__).resolve().parents[3]
SAVED = flat_values(GRPOConfig())  # one value per option, as a resume compares them


def changed(value: Any) -> Any:
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, tuple | list):
        return type(value)([*value, value[-1]] if value else [1])
    return "other"


@pytest.mark.parametrize("name", sorted(SAVED))
def test_each_option_is_applied_or_refused_as_the_rule_says(name: str) -> None:
    new = {**SAVED, name: changed(SAVED[name])}
    if name in RESUMABLE_OPTIONS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            applied = check_resume_config(SAVED, new)
        assert applied == ({} if name in ("resume", "overwrite") else {name: (SAVED[name], new[name])})
        assert all("cannot change" not in str(w.message) for w in caught)
    else:
        with pytest.raises(
            ConfigError, match=rf"cannot change on --resume: --{name.replace('_', '-')}: saved"
        ):
            check_resume_config(SAVED, new)


def test_several_refused_options_are_all_named_with_both_values() -> None:
    new = {**SAVED, "lr": 0.5, "seed": 9, "topk": 7, "steps": 1000}
    with pytest.raises(ConfigError) as error:
        check_resume_config(SAVED, new)
    message = str(error.value)
    for name, before, after in (("lr", SAVED["lr"], 0.5), ("seed", SAVED["seed"], 9), ("topk", 3, 7)):
        assert f"--{name}: saved {before!r}, now {after!r}" in message
    assert "--steps:" not in message.split("Options that may change")[0]  # steps may change


def test_the_documented_list_is_the_rule() -> None:
    """docs/security.md's "These may change" paragraph names exactly the options of RESUMABLE_OPTIONS."""
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    paragraph = text.split("These may change", 1)[1].split("\n\n", 1)[0]
    documented = {m.replace("-", "_") for m in re.findall(r"`--([a-z-]+)`", paragraph)}
    assert documented == RESUMABLE_OPTIONS - {"resume", "overwrite"}


def test_changed_options_on_resume_are_refused_or_applied_and_reported() -> None:
    saved = {"lr": 3e-4, "seed": 0, "steps": 10, "eval_every": 0, "resume": False, "run_dir": "r"}
    with pytest.raises(ConfigError, match=r"--lr: saved 0.0003, now 0.1.*--seed: saved 0, now 1"):
        check_resume_config(saved, {**saved, "lr": 0.1, "seed": 1, "resume": True})
    with pytest.warns(UserWarning, match=r"steps: 10 -> 20"):
        applied = check_resume_config(saved, {**saved, "steps": 20, "resume": True, "new_field": 1})
    assert applied == {"steps": (10, 20)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_resume_config(saved, {**saved, "resume": True}) == {}
