"""SearchQA as an OpenEnv environment: the real server in a subprocess, its client, `openenv validate`, the
Dockerfile's commands run here, and TRL's ``environment_factory`` driving the client in a GRPO step."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv", reason="OpenEnv is in the dev extra (`make test` installs it) and `openenv`")

from searchgym.app.openenv import SearchQAAction, SearchQAEnvClient
from searchgym.app.openenv.environment import SearchQAEnvironment
from searchgym.data import Question, load_dataset
from searchgym.errors import ConfigError, UnknownQuestionError

from ...conftest import NON_DEFAULT_ENV, SERVER_WAIT

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
READY = re.compile(r"serving SearchQA \(OpenEnv\) on (http://\S+)")
STARTUP_TIMEOUT_S = SERVER_WAIT  # a hang guard: the machine may be busy
SERVER_ARGS = ["--topk", "2", "--max-turns", "3", "--max-sessions", "16"]


def _questions() -> dict[str, Question]:
    return {q.id: q for q in load_dataset(None).questions("train")}


@contextlib.contextmanager
def _server(command: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Starts a server command (which prints its URL once bound), waits for /health, yields the URL."""
    environ = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=ROOT)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        url = None
        while url is None or not _healthy(url):
            assert proc.poll() is None, f"the server exited with {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the server did not come up:\n{log.read_text()}"
            found = READY.search(log.read_text())
            url = found.group(1) if found else None
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=SERVER_WAIT) as r:
            return r.status == 200 and json.loads(r.read())["status"] == "healthy"
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``searchgym openenv serve`` on a free port, the generated world's train split, top 2, three turns."""
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    command = [sys.executable, "-m", "searchgym.app.cli", "openenv", "serve", "--port", "0", *SERVER_ARGS]
    with _server([*command, "--log-level", "warning"], log) as url:
        yield url


def test_cli_registers_openenv_serve() -> None:
    from searchgym.app.cli import build_parser

    args = build_parser().parse_args(["openenv", "serve", "--reward", "f1", "--max-turns", "2"])
    assert args._command == ("openenv", "serve") and args.reward == "f1" and args.max_turns == 2


def test_episode_rewards_the_golden_answer_one_and_a_wrong_answer_zero(server: str) -> None:
    questions = _questions()
    with SearchQAEnvClient(base_url=server).sync() as env:
        for answer_right in (True, False):
            result = env.reset(seed=7)
            obs = result.observation
            question = questions[obs.question_id]
            assert result.reward is None and not result.done and obs.turns_left == 3
            assert obs.text.endswith(f"Question: {question.question}") and obs.question == question.question

            result = env.step(SearchQAAction.search(question.question))
            assert result.reward == 0.0 and not result.done
            assert len(result.observation.passage_ids) == 2  # --topk 2 reached the episodes
            assert result.observation.text.startswith("<information>Doc 1(Title: ")
            assert env.state().queries == [question.question]

            answer = question.golden_answers[0].upper() if answer_right else "certainly not this"
            result = env.step(SearchQAAction.answer(answer))
            assert result.done and result.reward == (1.0 if answer_right else 0.0)
            info = result.observation.metadata
            assert info["golden_answers"] == list(question.golden_answers) and info["searches"] == 1
            assert info["em"] == result.reward and info["end_reason"] == "answered"
            state = env.state()
            assert state.done and state.answer == answer and state.reward == result.reward
            assert state.step_count == 2 and state.question_id == question.id
            with pytest.raises(RuntimeError, match="no episode is running"):
                env.step(SearchQAAction.answer("again"))


def test_turn_budget_refuses_a_last_search_and_ends_at_zero(server: str) -> None:
    with SearchQAEnvClient(base_url=server).sync() as env:
        env.reset(question_id="train-3")
        assert env.step(SearchQAAction.search("one")).observation.error is None
        assert env.step(SearchQAAction.search("two")).observation.turns_left == 1
        result = env.step(SearchQAAction.search("three"))  # the last of --max-turns 3 is for the answer
        assert result.done and result.reward == 0.0
        assert "no searches left" in (result.observation.error or "")
        assert result.observation.metadata["end_reason"] == "turn_budget"
        with pytest.raises(RuntimeError, match="question 'nope' is not in this split"):
            env.reset(question_id="nope")
        with pytest.raises(RuntimeError, match="unknown reset options"):
            env.reset(split="test")


def test_seed_reproduces_the_question_across_sessions(server: str) -> None:
    with SearchQAEnvClient(base_url=server).sync() as a, SearchQAEnvClient(base_url=server).sync() as b:
        draws = [
            [
                env.reset(seed=11).observation.question_id,
                *(env.reset().observation.question_id for _ in range(3)),
            ]
            for env in (a, b)
        ]
    assert draws[0] == draws[1] and len(set(draws[0])) > 1  # a seed fixes the session's stream of questions


def test_concurrent_sessions_stay_isolated(server: str) -> None:
    """Two sessions at once, their steps interleaved on the server: each keeps its question and state."""
    questions = _questions()
    ids = ("train-10", "train-20")

    async def play() -> list[Any]:
        async with SearchQAEnvClient(base_url=server) as a, SearchQAEnvClient(base_url=server) as b:
            envs = (a, b)
            resets = await asyncio.gather(*(e.reset(question_id=q) for e, q in zip(envs, ids, strict=True)))
            assert [r.observation.question_id for r in resets] == list(ids)
            queries = [questions[q].question for q in ids]
            await asyncio.gather(
                *(e.step(SearchQAAction.search(q)) for e, q in zip(envs, queries, strict=True))
            )
            states = await asyncio.gather(*(e.state() for e in envs))
            assert [s.queries for s in states] == [[q] for q in queries]
            assert states[0].episode_id != states[1].episode_id
            # Each answers the other's question: a mixed-up session would score 1.
            swapped = [questions[ids[1]].golden_answers[0], questions[ids[0]].golden_answers[0]]
            return await asyncio.gather(
                *(e.step(SearchQAAction.answer(x)) for e, x in zip(envs, swapped, strict=True))
            )

    assert questions["train-10"].golden_answers[0] != questions["train-20"].golden_answers[0]
    results = asyncio.run(play())
    assert [r.reward for r in results] == [0.0, 0.0]
    assert [r.observation.metadata["question_id"] for r in results] == list(ids)


@pytest.mark.slow
def test_openenv_validate_passes_on_the_server_and_the_manifest(server: str, tmp_path: Path) -> None:
    """Both run offline: the running server's endpoints, and the manifest's static checks (the image build
    and the runtime checks that need it are skipped: no Docker here)."""
    openenv = str(BIN / "openenv")
    live = subprocess.run([openenv, "validate", "--url", server], capture_output=True, text=True, timeout=120)
    assert live.returncode == 0, live.stdout + live.stderr
    assert "Verdict: PASS" in live.stdout
    # The package is validated in a copy: a work tree may hold symbolic links (build/typecheck), which
    # `openenv validate` refuses in a package.
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "runs", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
    )
    shutil.copytree(ROOT, source, symlinks=True, ignore=ignore)
    local = subprocess.run(
        [openenv, "validate", str(source), "--skip-build", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert local.returncode == 0, local.stdout + local.stderr
    report = json.loads(local.stdout)
    statuses = {r["check_id"]: r["status"] for r in report["results"]}
    assert statuses["static.manifest"] == "pass" and "fail" not in statuses.values()


def _dockerfile() -> tuple[list[str], str, dict[str, str]]:
    """Dockerfile.openenv's RUN commands and CMD (ARG defaults and ENV values substituted), and its ARG and
    ENV values; its COPY sources must exist."""
    text = (ROOT / "Dockerfile.openenv").read_text().replace("\\\n", " ")
    variables: dict[str, str] = {}
    runs: list[str] = []
    cmd = ""

    def expand(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], value)

    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "ARG":
            name, _, default = rest.partition("=")
            variables[name] = default
        elif instruction == "ENV":
            for pair in shlex.split(expand(rest)):
                name, _, value = pair.partition("=")
                variables[name] = value
        elif instruction == "RUN":
            runs.append(expand(rest))
        elif instruction == "COPY":
            *sources, _ = rest.split()
            assert all((ROOT / source).exists() for source in sources), line
        elif instruction == "CMD":
            cmd = rest
    return runs, cmd, variables


@pytest.mark.slow
def test_dockerfile_commands_run_here(tmp_path: Path) -> None:
    """What the image build cannot show here: its install names a real extra, its RUN builds the index, and
    its CMD serves that index (in a folder standing for /opt/searchgym, on a free loopback port)."""
    runs, cmd, variables = _dockerfile()
    install, *searchgym_runs = runs
    assert install == 'pip install -c constraints.txt ".[openenv]"'
    assert "openenv =" in (ROOT / "setup.cfg").read_text()
    assert [r.split()[:3] for r in searchgym_runs] == [["searchgym", "index", "bm25"]]
    opt = f"{tmp_path}/"
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    for run in searchgym_runs:
        built = subprocess.run(
            ["sh", "-c", run.replace("/opt/searchgym/", opt)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PATH": path},
        )
        assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "index" / "bm25.json").is_file()

    argv = json.loads(cmd)
    assert argv[:2] == ["sh", "-c"] and argv[2].startswith(
        "exec searchgym openenv serve $SEARCHGYM_OPENENV_ARGS"
    )
    served = {"SEARCHGYM_OPENENV_ARGS": variables["SEARCHGYM_OPENENV_ARGS"].replace("/opt/searchgym/", opt)}
    # argparse keeps an option's last value: the same command, on loopback and a free port.
    command = ["sh", "-c", argv[2] + " --host 127.0.0.1 --port 0 --log-level warning"]
    log = tmp_path / "server.log"
    with _server(command, log, env=served) as url, SearchQAEnvClient(base_url=url).sync() as env:
        obs = env.reset(question_id="train-5").observation
        passages = env.step(SearchQAAction.search(obs.question)).observation.passage_ids
        golden = _questions()["train-5"].golden_answers[0]
        assert len(passages) == 3 and env.step(SearchQAAction.answer(golden)).reward == 1.0


def test_environment_options_and_errors() -> None:
    f1 = SearchQAEnvironment(reward="f1", split="test", max_turns=1)
    obs = f1.reset(question_id=load_dataset(None).questions("test")[0].id)
    assert obs.turns_left == 1
    golden = load_dataset(None).questions("test")[0].golden_answers[0]
    assert 0.0 < f1.step(SearchQAAction.answer(f"x {golden}")).reward < 1.0
    with pytest.raises(UnknownQuestionError):
        f1.reset(question_id="train-0")  # another split's question
    for bad in ({"max_turns": 0}, {"topk": 0}, {"reward": "bleu"}, {"max_passage_words": 0}):
        with pytest.raises(ConfigError):
            SearchQAEnvironment(**bad)
    with pytest.raises(ConfigError, match="no split 'dev'"):
        SearchQAEnvironment(split="dev")


def test_every_env_field_arrives_in_the_sessions_episodes() -> None:
    from searchgym.envs import EnvSpec

    env = SearchQAEnvironment(**NON_DEFAULT_ENV, seed=3)
    assert env.spec == EnvSpec(**NON_DEFAULT_ENV) == env._tool.spec  # the tool env plays it whole
    assert SearchQAEnvironment(EnvSpec(**NON_DEFAULT_ENV)).spec == env.spec
    obs = env.reset()
    assert obs.question_id.startswith("test-") and obs.turns_left == 3
    assert obs.question_id in {q.id for q in load_dataset(None, world_seed=1).questions("test")}
    assert len(env.step(SearchQAAction.search(obs.question)).passage_ids) == 2
    with pytest.raises(ConfigError, match=r"unknown environment options \['top_k'\]"):
        SearchQAEnvironment(top_k=2)


def test_openenv_serve_takes_every_env_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field given on the command line reaches the app's spec; the others keep the command's defaults
    (a patient retriever, as every command's)."""
    import searchgym.app.openenv.server as server_module
    from searchgym.app.cli import build_parser
    from searchgym.app.cli.openenv_serve import build_app
    from searchgym.envs import EnvSpec
    from searchgym.envs.spec import RUN_PATIENCE

    built: dict[str, Any] = {}
    monkeypatch.setattr(
        server_module, "create_searchqa_app", lambda spec, **kw: built.update(spec=spec, **kw)
    )
    args = []
    for name, value in NON_DEFAULT_ENV.items():
        flag = "--" + name.replace("_", "-")
        args += [flag.replace("--", "--no-", 1)] if value is False else [flag, str(value)]
    build_app(build_parser().parse_args(["openenv", "serve", *args, "--seed", "4"]))
    assert built["spec"] == EnvSpec(**NON_DEFAULT_ENV) and built["seed"] == 4
    build_app(build_parser().parse_args(["openenv", "serve"]))
    assert built["spec"] == EnvSpec(retriever_patience=RUN_PATIENCE)


def test_app_module_reads_its_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``searchgym.app.openenv.app:app`` (openenv.yaml's ``app``) is built from ``SEARCHGYM_OPENENV_ARGS``."""
    import importlib

    from fastapi.testclient import TestClient

    monkeypatch.setenv("SEARCHGYM_OPENENV_ARGS", "--split test --topk 1")
    sys.modules.pop("searchgym.app.openenv.app", None)
    app = importlib.import_module("searchgym.app.openenv.app").app
    sys.modules.pop("searchgym.app.openenv.app", None)
    with TestClient(app) as client:
        assert client.get("/health").json() == {"status": "healthy"}
        with client.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": {"seed": 0}})
            obs = ws.receive_json()["data"]["observation"]
            assert obs["question_id"].startswith("test-")
            ws.send_json({"type": "step", "data": {"tool": "search", "text": obs["question"]}})
            assert len(ws.receive_json()["data"]["observation"]["passage_ids"]) == 1


@pytest.mark.slow
def test_the_remote_tools_refuse_an_empty_query_as_the_local_tool_env_does(server: str) -> None:
    """Nothing is sent: the session's step count and searches stay as they were, and a search follows."""
    from searchgym.app.openenv.tools import SearchQARemoteTools
    from searchgym.errors import InvalidActionError

    tools = SearchQARemoteTools(server)
    try:
        tools.reset()
        for query in ("", "   "):
            with pytest.raises(InvalidActionError, match="the query is empty"):
                tools.search(query)
        state = tools._client.state()
        assert state.step_count == 0 and state.hit_ids == []
        assert tools.search("a question").startswith("<information>")
    finally:
        tools._client.close()


def test_trl_environment_factory_drives_the_client_in_a_grpo_step(
    server: str, scripted_tool_grpo: Any
) -> None:
    """TRL's GRPOTrainer with ``environment_factory=SearchQARemoteTools.factory(url)``: its tool calls and
    rewards go through OpenEnv sessions on the server; the model's turns are scripted (a random tiny model
    makes no tool calls), the rest is TRL's."""
    torch = pytest.importorskip("torch")
    from searchgym.app.openenv.tools import SearchQARemoteTools

    trainer, model = scripted_tool_grpo(SearchQARemoteTools.factory(server))
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["tools/call_frequency"] == 2.0 and logs["tools/failure_frequency"] == 0.0
    assert (
        logs["rewards/SearchQARemoteTools/mean"] == 0.5
    )  # the server's reward: EM of the answer tool's call
    infos = [env.observation.metadata for env in trainer._environment_pool[None]]
    assert [i["em"] for i in infos] == [1.0, 0.0, 1.0, 0.0] and all(i["searches"] == 1 for i in infos)
    assert any(0 in row for row in trainer._buffered_inputs[0]["tool_mask"].tolist())  # tool results masked
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# -- the guards `searchgym serve` has: idle sessions, bodies, bad input, repeated log lines ---------------------


def test_idle_sessions_are_closed_and_free_their_slots() -> None:
    """With every session slot held by a client that went quiet, a new client still gets a session once the
    idle ones pass ``session_timeout``."""
    from searchgym.app.openenv.server import create_searchqa_app
    from searchgym.server import ServerThread

    app = create_searchqa_app(topk=2, max_sessions=2, session_timeout=1.0)

    async def play(url: str) -> str:
        idle = [SearchQAEnvClient(base_url=url) for _ in range(2)]
        for client in idle:
            await client.__aenter__()
            await client.reset(seed=0)
        await asyncio.sleep(3.0)  # both sessions silent past the timeout
        async with SearchQAEnvClient(base_url=url) as fresh:
            result = await fresh.reset(question_id="train-3")
        for client in idle:
            with contextlib.suppress(Exception):
                await client.close()
        return str(result.observation.question_id)

    with ServerThread(app) as srv:
        assert asyncio.run(asyncio.wait_for(play(srv.url), SERVER_WAIT)) == "train-3"


def test_bad_input_and_large_bodies_over_http_are_one_4xx_line() -> None:
    from searchgym.app.openenv.server import create_searchqa_app
    from searchgym.server import ServerThread

    from ...conftest import server_client

    app = create_searchqa_app(topk=2)
    with ServerThread(app) as srv, server_client(srv.url) as http:
        r = http.post("/reset", json={"question_id": "nope"})
        assert r.status_code == 404 and "question 'nope' is not in this split" in r.json()["detail"]
        r = http.post("/step", json={"action": {"tool": "answer", "text": "x"}})  # no episode is running
        assert r.status_code == 409 and "no episode is running" in r.json()["detail"]
        json_body = {"content-type": "application/json"}
        r = http.post("/reset", content=b"{" + b" " * (2 << 20) + b"}", headers=json_body)
        assert r.status_code == 413 and "request body over 1048576 bytes" in r.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no content-length: the body is counted as it streams
            for _ in range(64):
                yield b" " * 65536

        r = http.post("/reset", content=chunks(), headers=json_body)
        assert r.status_code == 413
        assert http.get("/health").json() == {"status": "healthy"}


def test_openenv_serve_options_reach_the_guards() -> None:
    from searchgym.app.cli import build_parser
    from searchgym.app.cli.openenv_serve import build_app

    parser = build_parser()
    app = build_app(parser.parse_args(["openenv", "serve"]))
    limits = app.state.limits
    assert (limits.read_timeout, limits.max_connections, limits.max_body_bytes) == (10.0, 1024, 1 << 20)
    args = ["--read-timeout", "2.5", "--max-connections", "64", "--max-body-mb", "4"]
    args += ["--session-timeout", "30"]
    app = build_app(parser.parse_args(["openenv", "serve", *args]))
    limits = app.state.limits
    assert (limits.read_timeout, limits.max_connections, limits.max_body_bytes) == (2.5, 64, 4 << 20)
    with pytest.raises(ConfigError, match="session_timeout"):
        build_app(parser.parse_args(["openenv", "serve", "--session-timeout", "0"]))


def _can_unshare_network() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        return False
    return subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(
    not _can_unshare_network(), reason="needs `unshare -n` (root or user namespaces) and `ip`"
)
def test_the_image_serves_and_validates_with_no_route_but_loopback(tmp_path: Path) -> None:
    """The manifest's `network: no-network`, without Docker: in a fresh network namespace (only a loopback
    interface, no route out), the Dockerfile's index build and CMD run, an outbound connection fails, and
    `searchgym validate-env` passes every check against that server."""
    runs, cmd, variables = _dockerfile()
    _, *searchgym_runs = runs
    opt = f"{tmp_path}/"
    served = variables["SEARCHGYM_OPENENV_ARGS"].replace("/opt/searchgym/", opt)
    serve = json.loads(cmd)[2] + " --host 127.0.0.1 --port 8765 --log-level warning"
    world_seed = variables["WORLD_SEED"]
    script = "\n".join(
        [
            "set -e",
            "ip link set lo up",
            *(run.replace("/opt/searchgym/", opt) for run in searchgym_runs),
            f"export SEARCHGYM_OPENENV_ARGS={shlex.quote(served)}",
            f"sh -c {shlex.quote(serve)} > {tmp_path}/server.log 2>&1 &",
            "server=$!",
            "python - <<'EOF'",
            "import socket, time, urllib.request",
            "probe = socket.socket(); probe.settimeout(5)",
            "print('outbound', probe.connect_ex(('1.1.1.1', 80)))",
            "deadline = time.monotonic() + 120",
            "while True:",
            "    try:",
            "        urllib.request.urlopen('http://127.0.0.1:8765/health', timeout=5); break",
            "    except OSError:",
            "        assert time.monotonic() < deadline, 'the server did not come up'",
            "        time.sleep(0.5)",
            "EOF",
            f"searchgym validate-env --url http://127.0.0.1:8765 --world-seed {world_seed} "
            f"--manifest {ROOT / 'openenv.yaml'} --questions 2 --json; status=$?",
            "kill $server",
            "exit $status",
        ]
    )
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["unshare", "-n", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": path},
        cwd=tmp_path,
    )
    log = (tmp_path / "server.log").read_text() if (tmp_path / "server.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
    outbound = re.search(r"outbound (\d+)", done.stdout)
    assert outbound is not None and outbound.group(1) != "0"  # no route: the connection is refused at once
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["passed"] and [c["name"] for c in report["checks"]] == [
        "oracle",
        "floor",
        "leakage",
        "determinism",
        "state",
        "tools",
    ]
