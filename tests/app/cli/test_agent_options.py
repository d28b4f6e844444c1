"""What identifies an agent for the caches: a class's source (its package's files), a checkpoint's bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from searchgym.app.cli._agent_options import agent_sha256, source_sha256


def test_a_package_agents_digest_covers_every_module_of_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "digest_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "sub" / "__init__.py").write_text("", encoding="utf-8")
    (package / "sub" / "agent.py").write_text("class A:\n    pass\n", encoding="utf-8")
    (package / "helper.py").write_text("RATE = 1\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # found as the agent loader finds it: the current directory first
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # the packages it imports go with the test
    first = agent_sha256("digest_pkg.sub.agent:A")
    assert first is not None and len(first) == 64
    assert agent_sha256("digest_pkg.sub.agent:A") == first
    (package / "helper.py").write_text("RATE = 2\n", encoding="utf-8")  # a helper of the same package
    second = agent_sha256("digest_pkg.sub.agent:A")
    assert second != first
    (package / "sub" / "agent.py").write_text("class A:\n    x = 1\n", encoding="utf-8")
    assert agent_sha256("digest_pkg.sub.agent:A") not in (first, second)
    assert source_sha256("no_such_module_anywhere") is None


def test_single_modules_files_and_builtins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lone_agent.py").write_text("class B:\n    pass\n", encoding="utf-8")
    lone = agent_sha256("lone_agent:B")
    (tmp_path / "lone_agent.py").write_text("class B:\n    y = 2\n", encoding="utf-8")
    assert agent_sha256("lone_agent:B") != lone
    weights = tmp_path / "model.zip"
    weights.write_bytes(b"one")
    before = agent_sha256(f"sb3:{weights}")
    weights.write_bytes(b"two")
    assert agent_sha256(f"sb3:{weights}") != before
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    exported = agent_sha256(f"checkpoint:{folder}")
    (folder / "config.json").write_text('{"a": 1}', encoding="utf-8")
    assert agent_sha256(f"checkpoint:{folder}") not in (None, exported)
    assert agent_sha256("heuristic") is None and agent_sha256("openai:some-model") is None
