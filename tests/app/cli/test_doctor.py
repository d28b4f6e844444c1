"""``searchgym doctor``: it passes in the project's virtualenv, and each check, broken, fails (or, optional,
only says so) with a line that names the problem and the fix."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from searchgym.app.cli import main
from searchgym.app.doctor import checks as _doctor

REQUIRED = ("python", "requirements", "torch", "env", "bm25")


def doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, str]]:
    """Runs ``searchgym doctor ARGV`` in process: its exit code and its lines by check name."""
    code = main(["doctor", *argv])
    lines = capsys.readouterr().out.splitlines()
    by_name = {}
    for line in lines:
        match = re.match(r"^(ok|FAIL|warn|skip)\s+(extra \S+|\S+)\s", line)
        assert match, f"not a report line: {line!r}"
        by_name[match[2]] = line
    return code, by_name


def test_passes_in_this_virtualenv(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = doctor(capsys)
    assert code == 0, "\n".join(lines.values())
    for name in REQUIRED:
        assert lines[name].startswith("ok "), lines[name]
    assert "torch 2." in lines["torch"] and "devices: cpu" in lines["torch"]
    assert "gold passage at rank 1" in lines["bm25"]
    assert lines["retriever"].endswith("skipped: no --retriever given")
    assert lines["tokenizer"].startswith("skip ") and lines["model"].startswith("skip ")
    assert "fix:" not in "\n".join(lines.values())


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert all(set(c) == {"name", "status", "required", "detail", "fix"} for c in checks.values())
    assert all(checks[name]["status"] == "ok" and checks[name]["required"] for name in REQUIRED)
    assert checks["extra trl"]["required"] is False
    assert checks["retriever"] == {
        "name": "retriever",
        "status": "skip",
        "required": False,
        "detail": "skipped: no --retriever given",
        "fix": None,
    }


def test_one_line_per_extra_of_setup_cfg() -> None:
    extras = set(metadata.metadata("searchgym").get_all("Provides-Extra") or []) - set(_doctor.NOT_FEATURES)
    names = {c.name for c in _doctor.check_extras()}
    assert names == {f"extra {e}" for e in extras}
    assert set(_doctor.EXTRA_PURPOSE) == extras


@pytest.mark.slow
def test_console_script_exits_0() -> None:
    script = Path(sys.executable).parent / "searchgym"
    done = subprocess.run([str(script), "doctor"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^ok +env +SearchQA-v0: reset", done.stdout, re.M), done.stdout


# -- each check, broken --------------------------------------------------------------------------------


def test_unsatisfied_requirement(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = _doctor.installed_version
    monkeypatch.setattr(_doctor, "installed_version", lambda n: "1.2" if n == "numpy" else real(n))
    code, lines = doctor(capsys)
    assert code == 1
    assert lines["requirements"].startswith("FAIL  requirements")
    assert (
        "numpy 1.2 does not satisfy numpy>=1.24; fix: pip install -c constraints.txt 'numpy>=1.24'"
        in (lines["requirements"])
    )


def test_missing_requirement(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = _doctor.requirements
    monkeypatch.setattr(_doctor, "requirements", lambda: [*real(), Requirement("no-such-dist>=2")])
    code, lines = doctor(capsys)
    assert code == 1
    assert "FAIL  requirements" in lines["requirements"]
    assert (
        "no-such-dist>=2 is not installed; fix: pip install -c constraints.txt 'no-such-dist>=2'"
        in (lines["requirements"])
    )


def test_python_too_old(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_doctor.platform, "python_version", lambda: "3.9.18")
    code, lines = doctor(capsys)
    assert code == 1
    assert lines["python"] == (
        "FAIL  python             Python 3.9.18 does not satisfy >=3.10; fix: use a Python >=3.10 (in the "
        "repository: `make venv PYTHON=python3.11`)"
    )


def test_torch_missing(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    code, lines = doctor(capsys)
    assert code == 1
    assert lines["torch"].startswith("FAIL  torch              not importable (ModuleNotFoundError")
    assert "fix: pip install -c constraints.txt -e '.[train]'" in lines["torch"]
    assert [name for name, line in lines.items() if line.startswith("FAIL")] == ["torch"]


def test_torch_too_old(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch, "__version__", "2.0.1+cpu")
    code, lines = doctor(capsys)
    assert code == 1
    assert "torch 2.0.1+cpu does not satisfy torch>=2.1" in lines["torch"]
    assert "fix: pip install -c constraints.txt 'torch>=2.1'" in lines["torch"]


@pytest.mark.parametrize("visible", [2, 0])
def test_torch_cuda_build_and_devices(visible: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    check = _doctor.check_torch()
    assert check.status == "ok"
    devices = "2 CUDA devices (NVIDIA H100 80GB HBM3)" if visible else "no CUDA device visible"
    assert check.detail == f"torch {torch.__version__} (CUDA 12.4 build); devices: cpu, {devices}"


def test_env_failing(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import gymnasium

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the env is broken")

    monkeypatch.setattr(gymnasium, "make", broken)
    code, lines = doctor(capsys)
    assert code == 1
    assert lines["env"].startswith(
        "FAIL  env                RuntimeError: the env is broken; fix: run `make venv`"
    )
    assert "`searchgym eval --agent oracle --episodes 1` shows the full traceback" in lines["env"]
    assert lines["bm25"].startswith("ok ")


@pytest.mark.parametrize("answer", ["raise", "empty"])
def test_bm25_failing(
    answer: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from searchgym.retrieval import BM25Retriever

    def search(self: Any, queries: Any, k: int) -> Any:
        if answer == "raise":
            raise ValueError("the index is broken")
        return [[] for _ in queries]

    monkeypatch.setattr(BM25Retriever, "search", search)
    code, lines = doctor(capsys)
    assert code == 1
    expected = "ValueError: the index is broken" if answer == "raise" else "no passage for 'In which country"
    assert lines["bm25"].startswith(f"FAIL  bm25               {expected}")
    assert "fix: run `make venv`" in lines["bm25"]


def test_optional_extra_missing_keeps_exit_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _doctor.installed_version
    monkeypatch.setattr(
        _doctor, "installed_version", lambda n: None if n in ("trl", "faiss-cpu") else real(n)
    )
    code, lines = doctor(capsys)
    assert code == 0
    assert lines["extra trl"] == (
        "skip  extra trl          train trl: not installed: trl (installed: transformers "
        f"{metadata.version('transformers')}); to enable: pip install -c constraints.txt -e '.[trl]'"
    )
    assert lines["extra dense"].startswith(
        "skip  extra dense        index dense, dense: and hybrid: retrievers: not installed: faiss-cpu"
    )
    assert lines["extra dense"].endswith("to enable: pip install -c constraints.txt -e '.[dense]'")


def test_optional_extra_too_old_warns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _doctor.installed_version
    monkeypatch.setattr(_doctor, "installed_version", lambda n: "1.0.0" if n == "trl" else real(n))
    code, lines = doctor(capsys)
    assert code == 0
    assert lines["extra trl"] == (
        "warn  extra trl          train trl: trl 1.0.0 does not satisfy trl<2,>=1.16; fix: pip install -c "
        "constraints.txt 'trl<2,>=1.16'"
    )


def test_verl_lives_in_its_own_virtualenv(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _doctor.installed_version
    monkeypatch.setattr(_doctor, "installed_version", lambda n: None if n == "verl" else real(n))
    code, lines = doctor(capsys)
    assert code == 0
    assert lines["extra verl"].startswith(
        "skip  extra verl         not in this virtualenv: verl pins transformers < 5.11, so it has its own, "
        ".venv-verl ("
    )


# -- --retriever -----------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_retriever(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    code, lines = doctor(capsys, "--retriever", url)
    assert code == 1
    assert lines["retriever"].startswith(f"FAIL  retriever          {url}/retrieve is not reachable (")
    assert lines["retriever"].endswith(
        "fix: start a server (`searchgym serve --corpus DIR --port PORT`) or correct the URL"
    )


@pytest.fixture
def garbage_server() -> Iterator[str]:
    """An HTTP server answering every POST with 200 and JSON that is not the retrieval protocol."""

    class Garbage(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            body = json.dumps({"hello": "world", "results": [1, 2, 3]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_retriever_that_does_not_speak_the_protocol(
    capsys: pytest.CaptureFixture[str], garbage_server: str
) -> None:
    code, lines = doctor(capsys, "--retriever", garbage_server)
    assert code == 1
    assert lines["retriever"].startswith(
        f"FAIL  retriever          retrieval server {garbage_server}/retrieve answered no 'result' list for 1 "
        "queries; fix: the server does not answer the /retrieve protocol"
    )


def test_working_retriever(capsys: pytest.CaptureFixture[str], world: Any, retriever: Any) -> None:
    from searchgym.server import ServerThread, create_app

    with ServerThread(create_app(retriever, world.passages)) as server:
        code, lines = doctor(capsys, "--retriever", server.url)
    assert code == 0
    assert lines["retriever"].startswith(
        f"ok    retriever          {server.url}/retrieve: 3 passages for 'In which country is Distul?'"
    )


# -- --tokenizer and --model -----------------------------------------------------------------------------


@pytest.fixture
def hf_tokenizer() -> Any:
    """The built-in tokenizer as a ``transformers`` fast tokenizer (offline)."""
    from searchgym.tokenization import builtin_tokenizer

    return builtin_tokenizer().to_transformers()


def test_tokenizer_and_model_pass(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, hf_tokenizer: Any
) -> None:
    from searchgym.agents.llm import tiny_causal_lm

    folder = tmp_path / "model"
    tiny_causal_lm(len(hf_tokenizer), layers=1, hidden=32).save_pretrained(folder)
    hf_tokenizer.save_pretrained(folder)
    offline = os.environ.get("HF_HUB_OFFLINE")
    code, lines = doctor(capsys, "--model", str(folder))
    assert os.environ.get("HF_HUB_OFFLINE") == offline  # set for the loads only
    assert code == 0, "\n".join(lines.values())
    assert lines["tokenizer"] == (
        f"ok    tokenizer          {folder}: 8192 ids, EOS id 1; the 8 tags round-trip and SearchQA-v0 ends a "
        "search turn and an answer turn at their closing tags"
    )
    assert re.match(
        rf"ok +model +{re.escape(str(folder))}: qwen2, 0\.\d+M parameters, loaded in ", lines["model"]
    )
    assert lines["model"].endswith("a logit for each of the tokenizer's 8192 ids")


def test_model_smaller_than_its_tokenizer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, hf_tokenizer: Any
) -> None:
    from searchgym.agents.llm import tiny_causal_lm

    tiny_causal_lm(100, layers=1, hidden=32).save_pretrained(tmp_path / "model")
    hf_tokenizer.save_pretrained(tmp_path / "tok")
    code, lines = doctor(capsys, "--model", str(tmp_path / "model"), "--tokenizer", str(tmp_path / "tok"))
    assert code == 1
    assert lines["tokenizer"].startswith("ok ")
    assert "the model outputs 100 logits but tokenizer" in lines["model"]
    assert lines["model"].endswith("fix: pass --tokenizer with the model's own tokenizer")


def test_missing_tokenizer_and_model_paths(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    code, lines = doctor(capsys, "--model", str(missing))
    assert code == 1
    assert lines["tokenizer"] == (
        f"FAIL  tokenizer          {missing}: no such folder; fix: pass a folder that holds a tokenizer"
    )
    assert (
        lines["model"]
        == f"FAIL  model              {missing}: no such folder; fix: pass a folder that holds a model"
    )


def test_folder_without_a_tokenizer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, lines = doctor(capsys, "--tokenizer", str(tmp_path))
    assert code == 1
    assert lines["tokenizer"].startswith(f"FAIL  tokenizer          tokenizer '{tmp_path}': ")
    assert "fix: pass a local folder holding a fast tokenizer (tokenizer.json)" in lines["tokenizer"]


def test_tag_that_is_a_special_token(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, hf_tokenizer: Any
) -> None:
    hf_tokenizer.add_special_tokens({"additional_special_tokens": ["</search>"]})
    hf_tokenizer.save_pretrained(tmp_path / "tok")
    code, lines = doctor(capsys, "--tokenizer", str(tmp_path / "tok"))
    assert code == 1
    assert lines["tokenizer"] == (
        f"FAIL  tokenizer          {tmp_path / 'tok'}: tags that do not decode to themselves (the env would not "
        "see them): </search> -> b''; fix: use a tokenizer in which the tags are plain text, not special or "
        "unknown tokens (remove added tag tokens, or keep them with special=False)"
    )


def test_tags_that_are_unknown_tokens(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "</s>", "search", "answer", "Lyku", "Works", "Drelmont", "<", ">", "/", "?"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="</s>").save_pretrained(
        tmp_path / "words"
    )
    code, lines = doctor(capsys, "--tokenizer", str(tmp_path / "words"))
    assert code == 1
    assert "tags that do not decode to themselves" in lines["tokenizer"]
    assert "<information> -> " in lines["tokenizer"] and "<think> -> " in lines["tokenizer"]


def test_a_retriever_behind_a_proxy_is_not_dialled_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The HTTP client honours HTTP(S)_PROXY, so a direct connection says nothing about such a server."""
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert not _doctor._through_proxy("http", "retriever.example")
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    assert _doctor._through_proxy("http", "retriever.example")
    monkeypatch.setenv("no_proxy", "retriever.example")
    assert not _doctor._through_proxy("http", "retriever.example")


def test_bf16_line_says_whether_bf16_autocast_runs_bf16(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import searchgym.agents.llm.precision as precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    code, lines = doctor(capsys)
    assert lines["bf16"] == (
        "ok    bf16               CPU flags avx512_bf16: --precision bf16-autocast runs bfloat16 matrix products"
    )
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(precision.torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(precision.torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    code, lines = doctor(capsys)
    assert code == 0  # optional: a CPU without bfloat16 runs everything in fp32
    assert lines["bf16"].startswith("skip  bf16               the CPU has neither amx_bf16 nor avx512_bf16")
    assert "would run fp32 on this CPU" in lines["bf16"]
