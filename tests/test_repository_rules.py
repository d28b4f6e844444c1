"""Rules over the whole source tree rather than one module: no loader can run code from a file (no pickle, no
``eval``, no trusted ``torch.load``, never stable-baselines3's unpickling loader); and every test that
docs/security.md names as keeping a promise exists; no module outgrows its size cap; and imports keep to the
floors (foundations, ``searchgym.envs``, ``searchgym.agents``, the applications), with no cycle and no
import of another module's private names."""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


FOLDERS = {"searchgym": "searchgym", "envs": "searchgym.envs", "agents": "searchgym.agents"}
"""Each source folder and the package it installs as."""
FLOORS = ("foundations", "searchgym.envs", "searchgym.agents", "applications")
"""The floors, bottom first: a module imports only from its own floor or one below it."""
APPLICATIONS = "searchgym.app"
"""The applications floor: every command and tool built on the library."""


@dataclass(frozen=True)
class ImportEdge:
    """One import statement's dependency of ``source`` on ``target`` (modules of the package).

    ``names`` are the names a ``from target import …`` takes that are not modules themselves."""

    source: str
    target: str
    file: str
    line: int
    names: tuple[str, ...] = ()


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by its import name."""
    modules = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            modules[".".join((package, *parts))] = path
    return modules


def import_edges(root: Path) -> tuple[list[ImportEdge], set[str]]:
    """Every import statement between modules of the package, wherever it stands (module level, inside a
    function, under ``TYPE_CHECKING``): each is a dependency, as each makes one module need another. Also the
    alias modules: a module whose one statement re-exports from the applications floor belongs to that
    floor."""
    modules = package_modules(root)
    edges: list[ImportEdge] = []
    aliases = set()

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        file = path.relative_to(root).as_posix()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges += [
                    ImportEdge(module, known(a.name), file, node.lineno) for a in node.names if known(a.name)
                ]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = ".".join(package.split(".")[: package.count(".") + 2 - node.level])
                    base = f"{anchor}.{base}".rstrip(".")
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        edges.append(ImportEdge(module, f"{base}.{alias.name}", file, node.lineno))
                    elif known(base):
                        edges.append(ImportEdge(module, known(base), file, node.lineno, (alias.name,)))
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        body = [n for n in body if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
        alias = len(body) == 1 and isinstance(body[0], ast.ImportFrom) and body[0].level == 0
        if (
            alias
            and (body[0].module or "").startswith(APPLICATIONS + ".")
            and not module.startswith(APPLICATIONS)
        ):
            aliases.add(module)
    return edges, aliases


def floor_of(module: str) -> int:
    """The floor a module stands on, as an index into ``FLOORS``."""
    for level, package in ((3, APPLICATIONS), (2, "searchgym.agents"), (1, "searchgym.envs")):
        if module == package or module.startswith(package + "."):
            return level
    return 0


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def import_cycles(edges: Iterable[ImportEdge]) -> list[set[str]]:
    """The modules that import each other, directly or around a loop (Tarjan's strongly connected
    components of more than one module)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if edge.source != edge.target:
            graph.setdefault(edge.source, set()).add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while not component or node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                cycles.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def floor_violations(edges: list[ImportEdge], floor: Callable[[str], int] = floor_of) -> list[str]:
    """Each broken rule as ``file:line: rule``: an import of a floor above the importer's; an import of
    another module's ``_private`` name, or of a ``_private`` module from outside its package; an import that
    closes a cycle."""
    found = []
    for edge in edges:
        if floor(edge.target) > floor(edge.source):
            found.append(
                f"{edge.file}:{edge.line}: {edge.source} ({FLOORS[floor(edge.source)]}) imports {edge.target} "
                f"({FLOORS[floor(edge.target)]}), a floor above it"
            )
        found += [
            f"{edge.file}:{edge.line}: {edge.source} imports {name}, a private name of {edge.target}"
            for name in edge.names
            if _private(name)
        ]
        owner = edge.target.split("._")[0]
        if not edge.names and owner != edge.target and not (edge.source + ".").startswith(owner + "."):
            found.append(f"{edge.file}:{edge.line}: {edge.source} imports {edge.target}, private to {owner}")
    for cycle in import_cycles(edges):
        found += [
            f"{edge.file}:{edge.line}: {edge.source} imports {edge.target}, closing a cycle among "
            f"{', '.join(sorted(cycle))}"
            for edge in edges
            if edge.source in cycle and edge.target in cycle and edge.source != edge.target
        ]
    return list(dict.fromkeys(found))  # one line per statement and rule, however many names it takes


def test_imports_keep_to_the_floors() -> None:
    """Foundations import neither envs, agents nor the applications; envs never imports agents; nothing below
    the applications imports them; no import cycle; no import of another module's private names."""
    edges, aliases = import_edges(ROOT)
    found = floor_violations(edges, lambda module: 3 if module in aliases else floor_of(module))
    assert len(edges) > 1000
    assert not found, "\n".join(found)


def test_the_floor_rule_fails_on_planted_violations() -> None:
    """Fed a graph with one of each broken rule, the rule names each one by file and line."""
    edges = [
        ImportEdge("searchgym.rewards", "searchgym.envs.spec", "searchgym/rewards.py", 3),
        ImportEdge("searchgym.envs.spec", "searchgym.agents.base", "envs/spec.py", 4),
        ImportEdge("searchgym.agents.base", "searchgym.app.cli", "agents/base.py", 5),
        ImportEdge("searchgym.stats", "searchgym.stats", "searchgym/stats.py", 6),
        ImportEdge("searchgym.stats", "searchgym.rewards", "searchgym/stats.py", 7, ("_normalise",)),
        ImportEdge("searchgym.stats", "searchgym.data._jsonl", "searchgym/stats.py", 8),
        ImportEdge("searchgym.data", "searchgym.data._jsonl", "searchgym/data/__init__.py", 9),
        ImportEdge("searchgym.app.a", "searchgym.app.b", "searchgym/app/a.py", 10),
        ImportEdge("searchgym.app.b", "searchgym.app.c", "searchgym/app/b.py", 11),
        ImportEdge("searchgym.app.c", "searchgym.app.a", "searchgym/app/c.py", 12),
        ImportEdge("searchgym.app.c", "searchgym.envs", "searchgym/app/c.py", 13),
    ]
    found = floor_violations(edges)
    assert [line.split(" ")[0] for line in found] == [
        "searchgym/rewards.py:3:",
        "envs/spec.py:4:",
        "agents/base.py:5:",
        "searchgym/stats.py:7:",
        "searchgym/stats.py:8:",
        "searchgym/app/a.py:10:",
        "searchgym/app/b.py:11:",
        "searchgym/app/c.py:12:",
    ]
    assert "(foundations) imports searchgym.envs.spec (searchgym.envs), a floor above it" in found[0]
    assert "(searchgym.envs) imports searchgym.agents.base (searchgym.agents)" in found[1]
    assert "(searchgym.agents) imports searchgym.app.cli (applications)" in found[2]
    assert found[3].endswith("imports _normalise, a private name of searchgym.rewards")
    assert found[4].endswith("imports searchgym.data._jsonl, private to searchgym.data")
    assert found[5].endswith("closing a cycle among searchgym.app.a, searchgym.app.b, searchgym.app.c")


def test_the_floor_rule_finds_a_violation_planted_in_a_copy_of_the_tree(tmp_path: Path) -> None:
    """The walk itself: an upward import (inside a function), a private import (relative, under
    ``TYPE_CHECKING``) and a cycle (module level) written into a copy of the source are each found."""
    for folder in FOLDERS:
        shutil.copytree(
            ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.pyc", "__pycache__")
        )
    before = set(floor_violations(import_edges(tmp_path)[0]))
    with (tmp_path / "searchgym" / "rewards.py").open("a", encoding="utf-8") as f:
        f.write("\n\ndef _planted() -> None:\n    from searchgym.agents.planted import Agent\n")
    (tmp_path / "agents" / "planted.py").write_text('"""An agents module nothing else imports."""\n')
    planted = (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .spec import _planted_private\n"
    )
    (tmp_path / "envs" / "planted.py").write_text(planted)
    (tmp_path / "searchgym" / "planted_a.py").write_text('"""A."""\n\nfrom searchgym import planted_b\n')
    (tmp_path / "searchgym" / "planted_b.py").write_text('"""B."""\n\nimport searchgym.planted_a\n')
    lines = {
        name: len((tmp_path / name).read_text(encoding="utf-8").splitlines())
        for name in ("searchgym/rewards.py",)
    }
    found = [line for line in floor_violations(import_edges(tmp_path)[0]) if line not in before]
    assert len(found) == 4, found
    assert found[0].startswith(f"searchgym/rewards.py:{lines['searchgym/rewards.py']}: searchgym.rewards ")
    assert "imports searchgym.agents.planted (searchgym.agents), a floor above it" in found[0]
    assert found[1] == (
        "envs/planted.py:4: searchgym.envs.planted imports _planted_private, a private name of searchgym.envs.spec"
    )
    assert found[2:] == [
        "searchgym/planted_a.py:3: searchgym.planted_a imports searchgym.planted_b, closing a cycle among "
        "searchgym.planted_a, searchgym.planted_b",
        "searchgym/planted_b.py:3: searchgym.planted_b imports searchgym.planted_a, closing a cycle among "
        "searchgym.planted_a, searchgym.planted_b",
    ]


def test_architecture_md_draws_the_floors_the_imports_have() -> None:
    """docs/architecture.md's table of imports between floors: no count above the diagonal (no arrow runs up),
    and a count exactly where the package has imports from one floor to another."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"^\| (applications|searchgym\.agents|searchgym\.envs|foundations) \| ([\d |]+)\|$", text, re.M
    )
    drawn = {
        (FLOORS.index(name), target)
        for name, cells in rows
        for target, count in enumerate(cells.split("|"))
        if int(count) > 0
    }
    edges, aliases = import_edges(ROOT)
    floor = {module: 3 if module in aliases else floor_of(module) for module in package_modules(ROOT)}
    assert len(rows) == len(FLOORS)
    assert all(target <= source for source, target in drawn)
    assert drawn == {(floor[edge.source], floor[edge.target]) for edge in edges}
