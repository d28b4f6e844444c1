"""Rules over the whole source tree rather than one module: no loader can run code from a file (no pickle, no
``eval``, no trusted ``torch.load``, never stable-baselines3's unpickling loader); and every test that
docs/security.md names as keeping a promise exists; and no module outgrows its size cap."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_loader_can_execute_code_from_a_file() -> None:
    """Every place that deserialises: no pickle, no eval, no trusted torch.load outside the explicit upgrade."""
    patterns = {
        "weights_only=False": re.compile(r"weights_only\s*=\s*False"),
        "allow_pickle=True": re.compile(r"allow_pickle\s*=\s*True"),
        "pickle.load": re.compile(r"\bpickle\.loads?\("),
        "eval/exec": re.compile(r"(?<![.\w])(eval|exec)\("),
        "yaml.load": re.compile(r"yaml\.(unsafe_)?load\("),
        "trust_remote_code=True": re.compile(r"trust_remote_code\s*=\s*True"),
        "torch.load without weights_only": re.compile(r"torch\.load\((?![^)]*weights_only)"),
    }
    allowed = {("agents/training/checkpoint.py", "weights_only=False")}  # upgrade_checkpoint, explicit opt-in
    found = []
    for folder in ("searchgym", "envs", "agents"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            code = "\n".join(line.split("#")[0] for line in path.read_text(encoding="utf-8").splitlines())
            code = re.sub(r'""".*?"""', "", code, flags=re.S)  # docstrings may name what is forbidden
            for name, pattern in patterns.items():
                hits = len(pattern.findall(code))
                if hits and (rel, name) not in allowed:
                    found.append((rel, name))
                if (rel, name) in allowed:
                    assert hits == 1, f"{rel}: {name} must stay confined to upgrade_checkpoint"
    assert not found


def test_no_module_loads_sb3_files_through_stable_baselines3s_unpickling_loader() -> None:
    """``BaseAlgorithm.load`` and ``load_from_zip_file`` unpickle the zip's ``data``: never called."""
    pattern = re.compile(r"load_from_zip_file|cloudpickle|\b(PPO|A2C|DQN|ALGORITHMS\[[^\]]+\])\.load\(")
    hits = [
        path.relative_to(ROOT).as_posix()
        for folder in ("searchgym", "envs", "agents")
        for path in (ROOT / folder).rglob("*.py")
        if pattern.search(
            "\n".join(line.split("#")[0] for line in path.read_text(encoding="utf-8").splitlines())
        )
    ]
    assert hits == []


def test_every_test_docs_security_names_exists() -> None:
    """docs/security.md keeps each promise with the test that keeps it (``tests/FILE.py::test_name``, a whole
    ``tests/FILE.py``, or a bare name): a moved, renamed or deleted test is caught."""
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    cited = re.findall(r"`(tests/[\w/]+\.py)(?:::(test_\w+))?`", text)
    bare = set(re.findall(r"`(test_\w+)`", text))
    defined = {
        path.relative_to(ROOT).as_posix(): set(re.findall(r"^def (test_\w+)", path.read_text(), re.M))
        for path in (ROOT / "tests").rglob("*.py")
    }
    assert len({name for _, name in cited if name} | bare) >= 30
    missing = [
        f"{path}::{name}" for path, name in cited if path not in defined or name not in {"", *defined[path]}
    ]
    assert missing == []
    assert sorted(bare - set().union(*defined.values())) == []


def test_every_request_a_test_sends_a_server_it_started_names_its_timeout() -> None:
    """On a machine whose cores are busy (CI beside experiment runs) a server's first answer can take longer
    than httpx's default 5 s. Every request or client a test makes names its timeout: ``SERVER_WAIT`` (the
    one helper in ``tests/conftest.py``: ``server_client``, ``wait_for_health``) unless the test measures a
    deadline of its own."""
    import ast

    calls = {"get", "post", "put", "delete", "request", "stream", "Client", "AsyncClient", "urlopen"}
    missing = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            named = owner_name in ("httpx", "request") and node.func.attr in calls
            if named and not any(k.arg == "timeout" for k in node.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert missing == [], f"requests with httpx's default timeout: {missing}"


MODULE_CAP = 600
"""The most lines a module of the package may have; the GRPO trainer, one loop read top to bottom, has its
own cap."""
TRAINER_CAP = 700


def test_no_module_outgrows_its_size_cap() -> None:
    """A module past its cap is split by what its parts do, so each stays one readable room."""
    trainer = ROOT / "agents" / "grpo" / "trainer.py"
    over = []
    for folder in ("searchgym", "envs", "agents"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            cap = TRAINER_CAP - 1 if path == trainer else MODULE_CAP
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > cap:
                over.append(f"{path.relative_to(ROOT).as_posix()}: {lines} lines > {cap}")
    assert trainer.is_file()
    assert not over, over
