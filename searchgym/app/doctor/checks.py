"""The checks of ``searchgym doctor``: is this installation ready to run, and what can it do.

Each check returns a :class:`Check`; :func:`run_checks` runs them all in order. Heavy dependencies (torch,
transformers, the environments) are imported inside the check that needs them, so a missing one is a report
line, not a crash. Everything runs offline: a model or tokenizer is loaded with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import configparser
import platform
import socket
import time
from collections.abc import Callable
from functools import partial
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from searchgym.app.doctor.report import Check, exit_code, fail, format_check, ok, report_json
from searchgym.errors import checkout_root, install_command

__all__ = [
    "Check",
    "checkout_root",
    "exit_code",
    "format_check",
    "install_command",
    "report_json",
    "run_checks",
]


DISTRIBUTION = "searchgym"

#: Extras that are no feature of their own: ``all`` is the union of the others, ``dev`` and ``testing`` test
#: tooling.
NOT_FEATURES = ("all", "dev", "testing")
#: Distributions with a check of their own, left out of the extras' lines.
OWN_CHECK = ("torch",)
#: What each extra enables, for its report line.
EXTRA_PURPOSE = {
    "server": "searchgym serve and --retriever URL",
    "parquet": "parquet datasets",
    "train": "LLM agents, train sft/grpo, --model/--tokenizer by name",
    "sb3": "train sb3",
    "bench": "bench retrieval (bm25s, numba)",
    "dense": "index dense, dense: and hybrid: retrievers",
    "tensorboard": "TensorBoard logging",
    "wandb": "--report-to wandb",
    "openenv": "openenv serve",
    "trl": "train trl",
    "verl": "the verl integration",
    "verifiers": "the verifiers environment (searchgym-searchqa)",
}
VERL_VENV = ".venv-verl"
REINSTALL = "run `make venv` in the repository (or pip install -c constraints.txt -e '.[all,dev]')"
#: What to run when the env or a search fails: Python's own error, with its traceback.
TRACEBACK = "`searchgym eval --agent oracle --episodes 1` shows the full traceback"


def run_checks(
    retriever: str | None = None, model: str | None = None, tokenizer: str | None = None
) -> list[Check]:
    """Runs every check, in report order.

    Args:
        retriever: URL of a ``/retrieve`` server to try (``None``: that check is skipped).
        model: Model name or path to load offline (``None``: skipped).
        tokenizer: Tokenizer name or path to load offline (``None``: ``model``'s, or skipped without one).

    Returns:
        One :class:`Check` per line of the report.
    """
    checks = [
        _guarded("python", check_python),
        _guarded("requirements", check_requirements),
        _guarded("torch", check_torch),
        _guarded("bf16", check_bf16, required=False),
        *check_extras(),
        _guarded("env", check_env, f"{REINSTALL}; {TRACEBACK}"),
        _guarded("bm25", check_bm25, f"{REINSTALL}; {TRACEBACK}"),
        _guarded("retriever", lambda: check_retriever(retriever)),
    ]
    from searchgym.app.doctor.model import MODEL_FIX, TOKENIZER_FIX, check_model, check_tokenizer

    loaded: list[Any] = []
    checks.append(_guarded("tokenizer", lambda: check_tokenizer(tokenizer or model, loaded), TOKENIZER_FIX))
    checks.append(_guarded("model", lambda: check_model(model, loaded[0] if loaded else None), MODEL_FIX))
    return checks


def _guarded(name: str, check: Callable[[], Check], fix: str = REINSTALL, required: bool = True) -> Check:
    """Runs one check; an error it did not foresee becomes its line (failed, or a warning for an optional
    check), so the other checks still run."""
    try:
        return check()
    except Exception as e:  # reported, not swallowed: the line names the error
        return Check(name, "fail" if required else "warn", required, f"{type(e).__name__}: {e}", fix)


# -- what is installed -------------------------------------------------------------------------------------


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None`` when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def requirements() -> list[Requirement]:
    """The requirements of the installed ``searchgym`` (core and every extra, with their markers).

    In an editable checkout the ``install_requires`` of ``setup.cfg`` are added: a requirement added there
    since the install is missing from the installed metadata.
    """
    found = [Requirement(text) for text in metadata.requires(DISTRIBUTION) or []]
    root = checkout_root()
    if root is not None:
        config = configparser.ConfigParser(interpolation=None)
        config.read(root / "setup.cfg", encoding="utf-8")
        lines = config.get("options", "install_requires", fallback="").splitlines()
        listed = {str(r) for r in found}
        for line in lines:
            text = line.split("#", 1)[0].strip()
            if text and str(Requirement(text)) not in listed:
                found.append(Requirement(text))
    return found


def python_requires() -> str:
    """The ``Requires-Python`` of the installed ``searchgym`` (``""`` when it has none)."""
    return str((metadata.metadata(DISTRIBUTION).get_all("Requires-Python") or [""])[0])


def _extra_of(requirement: Requirement) -> str | None:
    """The extra a requirement belongs to, or ``None`` for a core requirement."""
    if requirement.marker is None:
        return None
    for extra in metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []:
        if requirement.marker.evaluate({"extra": extra}) and not requirement.marker.evaluate({"extra": ""}):
            return str(extra)
    return None


def _satisfies(version: str, specifier: SpecifierSet) -> bool:
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _wanted(requirement: Requirement) -> str:
    """A requirement without its marker: ``trl<2,>=1.16``."""
    return f"{requirement.name}{requirement.specifier}"


def _pin(requirement: Requirement) -> str:
    """The command that installs a version ``requirement`` accepts (within the checkout's constraints)."""
    constraints = "-c constraints.txt " if checkout_root() is not None else ""
    return f"pip install {constraints}'{_wanted(requirement)}'"


# -- the checks --------------------------------------------------------------------------------------------


def check_python() -> Check:
    """This interpreter against the package's ``python_requires``."""
    version, wanted = platform.python_version(), python_requires()
    if wanted and not _satisfies(version, SpecifierSet(wanted)):
        return fail(
            "python",
            f"Python {version} does not satisfy {wanted}",
            f"use a Python {wanted} (in the repository: `make venv PYTHON=python3.11`)",
        )
    return ok("python", f"Python {version} ({platform.python_implementation()}), needs {wanted}")


def check_requirements() -> Check:
    """The installed versions of the core requirements (``install_requires``) against their specifiers."""
    core = [r for r in requirements() if r.marker is None or r.marker.evaluate({"extra": ""})]
    found, problems, fixes = [], [], []
    for requirement in core:
        version = installed_version(requirement.name)
        if version is None:
            problems.append(f"{_wanted(requirement)} is not installed")
        elif not _satisfies(version, requirement.specifier):
            problems.append(f"{requirement.name} {version} does not satisfy {_wanted(requirement)}")
        else:
            found.append(f"{requirement.name} {version}")
            continue
        fixes.append(_pin(requirement))
    if problems:
        return fail("requirements", "; ".join(problems), " && ".join(fixes))
    return ok("requirements", ", ".join(found))


def check_torch() -> Check:
    """torch: installed and importable, its version and build, the devices it sees."""
    fix = f"{install_command('train')} (the CPU build `make venv` pins; for CUDA, the build for your driver)"
    try:
        import torch
    except ImportError as e:
        return fail("torch", f"not importable ({type(e).__name__}: {e}); the agents need it", fix)
    version = str(torch.__version__)
    wanted = [r for r in requirements() if r.name == "torch" and _extra_of(r) == "train"]
    if wanted and not _satisfies(version, wanted[0].specifier):
        return fail("torch", f"torch {version} does not satisfy {_wanted(wanted[0])}", _pin(wanted[0]))
    cuda = torch.version.cuda
    build = f"CUDA {cuda} build" if cuda else "CPU build"
    devices = ["cpu"]
    if cuda and torch.cuda.is_available():
        count = torch.cuda.device_count()
        names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
        devices.append(f"{count} CUDA device{'s' * (count > 1)} ({', '.join(names)})")
    elif cuda:
        devices.append("no CUDA device visible")
    if torch.backends.mps.is_available():
        devices.append("mps")
    return ok("torch", f"torch {version} ({build}); devices: {', '.join(devices)}")


def check_bf16() -> Check:
    """Whether this CPU multiplies bfloat16 matrices natively (AVX512-BF16 or AMX): what ``train grpo
    --precision bf16-autocast`` needs to run in bfloat16 (elsewhere it runs fp32, saying so)."""
    try:
        from searchgym.agents.llm.precision import bf16_support
    except ImportError:
        return Check("bf16", "skip", False, "not checked: torch is not importable")
    supported, reason = bf16_support("cpu")
    if supported:
        return Check(
            "bf16", "ok", False, f"{reason}: --precision bf16-autocast runs bfloat16 matrix products"
        )
    return Check("bf16", "skip", False, f"{reason}: --precision bf16-autocast would run fp32 on this CPU")


def check_extras() -> list[Check]:
    """One optional line per extra of ``setup.cfg``: installed, partly, or not (and how to install it)."""
    by_extra: dict[str, list[Requirement]] = {}
    for requirement in requirements():
        extra = _extra_of(requirement)
        if extra is not None and extra not in NOT_FEATURES and requirement.name not in OWN_CHECK:
            by_extra.setdefault(extra, []).append(requirement)
    return [
        _guarded(f"extra {extra}", partial(check_extra, extra, reqs), install_command(extra), False)
        for extra, reqs in by_extra.items()
    ]


def check_extra(extra: str, wanted: list[Requirement]) -> Check:
    """Whether an extra's distributions are installed at versions its specifiers accept (never required)."""
    name, purpose = f"extra {extra}", EXTRA_PURPOSE.get(extra, extra)
    found, missing, wrong = [], [], []
    for requirement in wanted:
        version = installed_version(requirement.name)
        if version is None:
            missing.append(requirement.name)
        elif not _satisfies(version, requirement.specifier):
            wrong.append(f"{requirement.name} {version} does not satisfy {_wanted(requirement)}")
        else:
            found.append(f"{requirement.name} {version}")
    if extra == "verl" and "verl" in missing:
        return _verl_elsewhere(name)
    if wrong:
        fix = " && ".join(_pin(r) for r in wanted if any(w.startswith(f"{r.name} ") for w in wrong))
        return Check(name, "warn", False, f"{purpose}: {'; '.join(wrong)}", fix)
    if missing:
        have = f" (installed: {', '.join(found)})" if found else ""
        return Check(
            name,
            "skip",
            False,
            f"{purpose}: not installed: {', '.join(missing)}{have}",
            install_command(extra),
        )
    return Check(name, "ok", False, f"{purpose}: {', '.join(found)}")


def _verl_elsewhere(name: str) -> Check:
    """verl pins an older transformers than the main virtualenv's: it lives in its own, ``.venv-verl``."""
    why = "not in this virtualenv: verl pins transformers < 5.11, so it has its own, .venv-verl"
    root = checkout_root()
    if root is None:
        return Check(name, "skip", False, why, install_command("verl"))
    versions = [
        dist.version
        for packages in sorted((root / VERL_VENV).glob("lib/python*/site-packages"))
        for dist in metadata.distributions(path=[str(packages)])
        if dist.metadata["Name"] == "verl"
    ]
    if versions:
        return Check(
            name, "skip", False, f"{why} (found there: verl {versions[0]}; `make test-verl` tests it)"
        )
    return Check(name, "skip", False, f"{why} (not built)", install_command("verl"))


def check_env() -> Check:
    """``gym.make("SearchQA-v0")`` on the default world: reset, then one step."""
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids

    start = time.perf_counter()
    env = gym.make("SearchQA-v0")
    try:
        obs, info = env.reset(seed=0)
        length = int(obs["length"][0])
        obs, *_ = env.step(int(obs["tokens"][0]))
        after = int(obs["length"][0])
    finally:
        env.close()
    took = time.perf_counter() - start
    if after != length + 1:
        fix = f"{REINSTALL}; {TRACEBACK}"
        return fail("env", f"one step made the transcript {after} tokens, not {length + 1}", fix)
    return ok("env", f"SearchQA-v0: reset ({length}-token prompt) and one step in {took:.2f}s")


def check_bm25() -> Check:
    """A BM25 search on the default world returns passages (and where the question's gold passage ranks)."""
    from searchgym.data import load_dataset
    from searchgym.retrieval import make_retriever

    dataset = load_dataset(None)
    question = next(q for q in dataset.questions("test") if q.supporting_ids)
    start = time.perf_counter()
    retriever = make_retriever("bm25", dataset.passages)
    try:
        hits = retriever.search([question.question], 3)[0]
    finally:
        retriever.close()
    took = time.perf_counter() - start
    if not hits:
        return fail(
            "bm25",
            f"no passage for {question.question!r} over {len(dataset.passages)}",
            REINSTALL,
        )
    ids = [h.passage_id for h in hits]
    gold = next((i for i, pid in enumerate(ids, 1) if pid in question.supporting_ids), None)
    where = f"gold passage at rank {gold}" if gold else "gold passage not in the top 3"
    return ok(
        "bm25",
        f"{len(hits)} passages for {question.question!r} ({where}) over {len(dataset.passages)} passages, "
        f"index and search in {took:.2f}s",
    )


def _through_proxy(scheme: str, host: str) -> bool:
    """Whether the HTTP client reaches ``host`` through a proxy the environment names (then a direct
    connection says nothing about it)."""
    import urllib.request

    return scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(host)


def check_retriever(url: str | None) -> Check:
    """Whether a ``/retrieve`` server is reachable, then one search through
    :class:`~searchgym.retrieval.http.HttpRetriever`, which checks the reply against the wire format."""
    if url is None:
        return Check("retriever", "skip", False, "skipped: no --retriever given")
    from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError
    from searchgym.retrieval.http import HttpRetriever

    query = "In which country is Distul?"
    try:
        client = HttpRetriever(url, timeout=5.0, retries=0)
    except MissingDependencyError as e:
        return fail("retriever", str(e).split(".")[0], install_command("server"))
    except ConfigError as e:
        return fail("retriever", str(e), "pass --retriever http://HOST:PORT[/retrieve]")
    with client:
        parts = urlsplit(client.url)
        address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        try:
            if not _through_proxy(parts.scheme, parts.hostname or ""):  # the client honours HTTP(S)_PROXY
                socket.create_connection(address, timeout=client.timeout).close()
        except OSError as e:
            return fail(
                "retriever",
                f"{client.url} is not reachable ({type(e).__name__}: {e})",
                "start a server (`searchgym serve --corpus DIR --port PORT`) or correct the URL",
            )
        start = time.perf_counter()
        try:
            hits = client.search([query], 3)[0]
        except RetrieverError as e:
            return fail(
                "retriever",
                str(e),
                "the server does not answer the /retrieve protocol (POST {queries, topk, return_scores} -> "
                "{result: [[{document: {id, contents}, score}]]}); point --retriever at `searchgym serve` or a "
                "Search-R1 retrieval server",
            )
        took = time.perf_counter() - start
    if not hits:
        detail = f"{client.url} answers the protocol but returned no passage for {query!r}"
        return Check("retriever", "warn", True, detail)
    detail = f"{client.url}: {len(hits)} passages for {query!r} in {took:.2f}s (top: {hits[0].title!r})"
    return ok("retriever", detail)
