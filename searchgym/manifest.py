"""Run manifests: what a run folder was made from, so that a result can be traced and reproduced.

Every command that writes a run folder (``train *``, ``index *``) writes ``manifest.json`` into it; a command
that writes one file (``eval --out FILE``, ``export-trajectories --out FILE``) writes ``FILE.manifest.json``
beside it, so several evaluations in one folder keep their own. A manifest records:

* ``searchgym`` version and git commit (with a dirty flag) when the package runs from a checkout;
* Python, NumPy, Gymnasium, torch and transformers versions (read from the installed distributions,
  nothing is imported);
* the dataset (``"world"`` with its seed and generator version, or the folder), the split, and content
  hashes of the split's questions and of the corpus;
* the retriever (kind, spec, top-k, retriever faults) and the hash of its index files when it reads any
  (a dense or hybrid index folder, a cassette; BM25 is built from the corpus, whose hash covers it);
* the tokenizer (name, vocabulary size, hash of every token's bytes);
* the episode settings (prompt style, reward, turn and context sizes), and the hash of the reward and
  answer-normalisation code (``searchgym/rewards.py``);
* the seeds, the command's full configuration, and the full command line.

Hashes are ``sha256:<hex>`` of the files' bytes, read once while a file is unchanged (a 21M-passage
corpus of ~14 GB takes about a minute the first time on one machine, then nothing).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "RECORD_LIMIT",
    "corpus_mismatch",
    "dataset_fingerprint",
    "file_digest",
    "folder_digest",
    "manifest_path",
    "read_manifest",
    "retriever_fingerprint",
    "run_manifest",
    "tokenizer_fingerprint",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
RECORD_LIMIT = 1 << 28
"""Files over this size (256 MiB) have their digest recorded beside them (``.verified.json``)."""
_PACKAGES = ("numpy", "gymnasium", "torch", "transformers")


# -- hashing ---------------------------------------------------------------------------------------------


def file_digest(path: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of a file's bytes (:func:`searchgym.integrity.file_sha256`: remembered while the file
    is unchanged; a file over :data:`RECORD_LIMIT` also records its digest beside it, so a large corpus is
    read once per machine, not once per run)."""
    from searchgym.integrity import file_sha256

    size = Path(path).stat().st_size
    return f"sha256:{file_sha256(Path(path), record=size > RECORD_LIMIT)}"


def folder_digest(path: str | os.PathLike[str]) -> str:
    """One hash over a folder's files (manifests and hidden files excepted): their relative paths and
    :func:`file_digest` values."""
    root = Path(path)
    digest = hashlib.sha256()
    # Manifests and hidden files (digest records, temporary files) are left out: writing a run's manifest
    # into its index folder must not change the index's hash.
    files = (
        p
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(MANIFEST_NAME) and not p.name.startswith(".")
    )
    for file in sorted(files):
        digest.update(f"{file.relative_to(root).as_posix()}\0{file_digest(file)}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def _records_digest(records: Iterable[Any]) -> str:
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, ensure_ascii=False, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return f"sha256:{digest.hexdigest()}"


# -- fingerprints ----------------------------------------------------------------------------------------


def _split_file(root: Path, split: str) -> Path | None:
    """The file holding ``split``'s questions (a sliced split, ``test[:100]``, is read from ``test``'s)."""
    from searchgym.data import parse_split

    stem = parse_split(split).name
    for name in (f"{stem}.jsonl", f"{stem}.parquet"):
        if (root / name).is_file():
            return root / name
    return None


def dataset_fingerprint(
    dataset: Any = None, split: str | None = "train", world_seed: int = 0
) -> dict[str, Any]:
    """What a dataset argument names, and content hashes of its corpus and of ``split``'s questions.

    Args:
        dataset: As the environments take it: ``None``/``"world"``, a FlashRAG folder, a Search-R1
            parquet file, or a :class:`~searchgym.data.Dataset` (hashed from memory).
        split: The question split (``None``: the corpus only).
        world_seed: Seed of the generated world.

    Raises:
        ConfigError: the dataset cannot be found (as :func:`~searchgym.data.load_dataset`).
    """
    from searchgym.data import WORLD_VERSION, Dataset, load_dataset

    if dataset is None or dataset == "world":
        world = load_dataset(None, world_seed=world_seed)
        return {
            "dataset": "world",
            "world_seed": world_seed,
            "world_version": WORLD_VERSION,
            "split": split,
            "questions_sha256": _questions_digest(world, split) if split is not None else None,
            "corpus_sha256": _passages_digest(world),
        }
    if isinstance(dataset, Dataset):
        return {
            "dataset": f"<in-memory Dataset {dataset.name!r}>",
            "split": split,
            "questions_sha256": _questions_digest(dataset, split) if split is not None else None,
            "corpus_sha256": _passages_digest(dataset),
        }
    path = Path(dataset).expanduser().resolve()
    if not path.exists():
        raise ConfigError(f"dataset {str(dataset)!r} does not exist")
    root = path if path.is_dir() else path.parent
    questions = path if path.is_file() else _split_file(root, split) if split is not None else None
    corpus = path if path.name == "corpus.jsonl" else root / "corpus.jsonl"
    if questions == corpus:
        questions = None
    return {
        "dataset": str(path),
        "split": split,
        "questions_sha256": file_digest(questions) if questions is not None else None,
        "corpus_sha256": file_digest(corpus) if corpus.is_file() else None,
    }


def _questions_digest(dataset: Any, split: str) -> str:
    return _records_digest(
        (q.id, q.question, list(q.golden_answers), list(q.supporting_ids)) for q in dataset.questions(split)
    )


def _passages_digest(dataset: Any) -> str:
    return _records_digest((p.id, p.contents) for p in dataset.passages)


def retriever_fingerprint(spec: Any, topk: int | None = None, faults: Any = None) -> dict[str, Any]:
    """The retriever's kind, spec, top-k and faults, and a hash of the index files it reads (if any).

    Args:
        spec: A retriever spec (as ``make_retriever`` takes it) or a retriever object.
        topk: Passages per search.
        faults: ``retriever_faults`` as the env takes it.
    """
    from searchgym.retrieval.faults import parse_faults

    parsed = parse_faults(faults)
    out: dict[str, Any] = {
        "kind": None,
        "spec": None,
        "topk": topk,
        "index_sha256": None,
        "faults": parsed.to_dict() if parsed is not None else None,
    }
    if spec is None or not isinstance(spec, str):
        name = "bm25" if spec is None else getattr(spec, "name", type(spec).__name__)
        out.update(kind=name, spec=name if spec is None else f"<{type(spec).__name__} object>")
        return out
    out["spec"] = spec
    if spec.startswith(("http://", "https://")):
        out["kind"] = "http"
    elif spec.startswith(("dense:", "hybrid:")):
        kind, _, folder = spec.partition(":")
        out["kind"] = kind
        out["index_sha256"] = folder_digest(folder) if Path(folder).is_dir() else None
    elif spec.startswith("cassette:"):
        path, _, option = spec[len("cassette:") :].partition(";")
        out["kind"] = "cassette"
        out["cassette_mode"] = option.partition("=")[0] or "replay"
        out["index_sha256"] = file_digest(path) if Path(path).is_file() else None
    else:
        out["kind"] = spec
    return out


def tokenizer_fingerprint(spec: Any = None) -> dict[str, Any]:
    """The tokenizer's name, vocabulary size, and a hash of every token's bytes and the EOS id.

    Two tokenizers with the same hash turn the same ids into the same text, which is what the episodes
    depend on. A tokenizer that cannot be loaded here is recorded by name, with the error, and no hash.
    """
    from searchgym.errors import SearchGymError
    from searchgym.tokenization import load_tokenizer

    try:
        tokenizer = load_tokenizer(spec)
    except (SearchGymError, OSError, ValueError) as e:  # recorded, not raised: the run itself has finished
        return {"name": str(spec), "vocab_size": None, "sha256": None, "error": f"{type(e).__name__}: {e}"}
    digest = hashlib.sha256()
    for piece in tokenizer.token_bytes:
        digest.update(len(piece).to_bytes(4, "little"))
        digest.update(piece)
    digest.update(str(tokenizer.eos_token_id).encode())
    return {
        "name": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "sha256": f"sha256:{digest.hexdigest()}",
    }


# -- the environment --------------------------------------------------------------------------------------


def _versions() -> dict[str, str | None]:
    from searchgym import __version__

    versions: dict[str, str | None] = {"searchgym": __version__, "python": platform.python_version()}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


@lru_cache(maxsize=1)
def _git() -> dict[str, Any] | None:
    """The commit of the checkout the package runs from, or ``None`` (an installed wheel, no git)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def _rewards_digest() -> str:
    from searchgym import rewards

    return file_digest(rewards.__file__)


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: dataclasses and mappings as dicts, paths as strings."""
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


ENV_RECORD_KEYS = ("dataset", "world_seed", "split", "retriever", "retriever_faults", "topk", "reward")
"""The fields of an env record (``EnvSpec.to_record()``) a manifest and a result card read: always given,
so no default of the spec's is written twice."""


def run_manifest(
    command: str,
    env: Mapping[str, Any] | None,
    *,
    seeds: Mapping[str, Any] | None = None,
    config: Any = None,
    argv: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest of a run.

    Args:
        command: The command, e.g. ``"train grpo"``.
        env: The environment as the run used it: its spec's record (``EnvSpec.to_record()``, every field)
            and the ``tokenizer`` by name; ``None`` for a command without an environment (``index``).
        seeds: The run's seeds by name.
        config: The command's full configuration (a dataclass or a mapping).
        argv: The command line (default: ``sys.argv``).
        extra: More sections (an index command's corpus and output hash, say).

    Raises:
        ConfigError: ``env`` lacks one of :data:`ENV_RECORD_KEYS`, or the dataset it names cannot be found.
    """
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "command": command,
        "argv": list(sys.argv if argv is None else argv),
        "versions": _versions(),
        "git": _git(),
    }
    if env is not None:
        missing = sorted(set(ENV_RECORD_KEYS) - set(env))
        if missing:
            raise ConfigError(
                f"the env record of a manifest lacks {missing}: give EnvSpec.to_record()'s whole"
            )
        manifest["data"] = dataset_fingerprint(env["dataset"], str(env["split"]), int(env["world_seed"]))
        manifest["retriever"] = retriever_fingerprint(env["retriever"], env["topk"], env["retriever_faults"])
        manifest["tokenizer"] = tokenizer_fingerprint(env.get("tokenizer"))
        manifest["episode"] = {
            k: _plain(v)
            for k, v in env.items()
            if k not in ("dataset", "world_seed", "split", "tokenizer", "retriever", "retriever_faults")
        }
        manifest["reward"] = {"metric": env["reward"], "rewards_sha256": _rewards_digest()}
    manifest["seeds"] = _plain(dict(seeds or {}))
    if config is not None:
        manifest["config"] = _plain(config)
    for key, value in (extra or {}).items():
        manifest[key] = _plain(value)
    return manifest


# -- files -------------------------------------------------------------------------------------------------


def manifest_path(out: str | os.PathLike[str], *, folder: bool) -> Path:
    """Where the manifest of an output goes: ``OUT/manifest.json`` for a run folder, ``OUT.manifest.json``
    beside a single output file."""
    path = Path(out)
    return path / MANIFEST_NAME if folder else path.with_name(path.name + "." + MANIFEST_NAME)


def write_manifest(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Writes ``manifest`` to ``path`` as indented JSON (through ``PATH.partial``, renamed when complete)."""
    from searchgym.data.jsonl import replace_on_success

    target = Path(path)
    with replace_on_success(target) as partial:
        partial.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return target


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest at ``path``, or ``None`` when there is none or it is not a readable JSON object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def corpus_mismatch(trained: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """How the corpus and index of a run's manifest differ from the current ones, or ``None``.

    Args:
        trained: A manifest (its ``data.corpus_sha256`` and ``retriever.index_sha256`` are compared).
        current: The same two sections for the environment at hand.

    Returns:
        A short description of the differences (hashes shortened to 12 hex digits), or ``None`` when they
        agree or the manifest records neither.
    """

    def short(value: Any) -> str:
        return str(value).split(":")[-1][:12] if value else "none"

    differences = []
    for label, section, key in (("corpus", "data", "corpus_sha256"), ("index", "retriever", "index_sha256")):
        before = (trained.get(section) or {}).get(key)
        now = (current.get(section) or {}).get(key)
        if before is not None and before != now:
            differences.append(f"{label} {short(before)} (trained) vs {short(now)} (this env)")
    return "; ".join(differences) or None
