"""``searchgym data get``: the public QA sets and the wiki-18 corpus that Search-R1 trains and evaluates on,
fetched into FlashRAG folders.

Where the files are published (Hugging Face dataset repositories; the host is ``base_url``, so a mirror
with the same layout serves as well):

* the QA sets: ``RUC-NLPIR/FlashRAG_datasets``, one folder per dataset holding ``{split}.jsonl`` in
  FlashRAG's own question format (``id``, ``question``, ``golden_answers``, ``metadata``). Search-R1 builds
  its training and test data from these folders.
* the corpus: ``PeterJinGo/wiki-18-corpus``, ``wiki-18.jsonl.gz`` — the 21M 100-word passages of the
  December 2018 Wikipedia dump (DPR's split), one FlashRAG corpus line each; the file Search-R1's retrieval
  setup downloads.
* the dense index Search-R1 publishes for it: ``PeterJinGo/wiki-18-e5-index``, ``part_aa`` and ``part_ab``,
  concatenated into ``e5_Flat.index`` (a faiss flat index of ``intfloat/e5-base-v2`` embeddings, read by
  Search-R1's own retrieval server, not by searchgym's ``dense:`` retriever).

A file is downloaded into ``TARGET.partial`` and renamed into place only once complete and verified: a
dropped connection resumes with an HTTP ``Range`` request (retried with a growing wait), and a run killed
half-way continues where it stopped. A file whose SHA-256 the package pins (:data:`PINNED_SHA256`) must
have that digest, whatever the host publishes. Any other file is checked against the hash its host
publishes for it — Hugging Face gives the SHA-256 of a large (LFS) file in ``X-Linked-Etag`` and the git
blob SHA-1 of a small one in ``ETag`` — and a host that publishes none (a plain mirror) is refused before
the body is read, unless ``accept_unverified`` (``--accept-unverified``) takes the file unchecked, with a
note. A mismatch deletes the download and stops with one line. ``OUT/searchgym-data.json`` records every
file fetched (its URL, size, SHA-256 and what it was checked against), so a second run skips them.
"""

from __future__ import annotations

import contextlib
import difflib
import gzip
import hashlib
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.data.jsonl import PARTIAL_SUFFIX, replace_on_success
from searchgym.errors import ConfigError, DataFormatError, DownloadError

__all__ = [
    "CORPUS",
    "DEFAULT_BASE_URL",
    "INDEX",
    "PINNED_SHA256",
    "QA_SETS",
    "RECORD",
    "RemoteFile",
    "catalog",
    "fetch_file",
    "get",
]

DEFAULT_BASE_URL = "https://huggingface.co"
FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"
CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
INDEX_REPO = "PeterJinGo/wiki-18-e5-index"

#: The QA sets and the splits each one publishes (FlashRAG's folder names, and its split names).
QA_SETS: dict[str, tuple[str, ...]] = {
    "nq": ("train", "dev", "test"),
    "triviaqa": ("train", "dev", "test"),
    "popqa": ("test",),
    "hotpotqa": ("train", "dev"),
    "2wikimultihopqa": ("train", "dev"),
    "musique": ("train", "dev"),
    "bamboogle": ("test",),
}
CORPUS = "wiki-18"
"""The corpus's name, and the folder it is written to (``OUT/wiki-18/corpus.jsonl``)."""
INDEX = "wiki-18-e5"
"""The dense index's name (written to ``OUT/wiki-18/e5_Flat.index``)."""
RECORD = "searchgym-data.json"
"""The file in ``OUT`` that records what was fetched."""

PINNED_SHA256: dict[str, str] = {}
"""The SHA-256 of known files, by ``REPO/PATH``: a download of a pinned file must have this digest, whatever
its host publishes, at any revision. Add a file's digest here once it is known from a download verified
against Hugging Face's own published hash (``searchgym-data.json`` records it). The table is empty in this
release: the published files' digests could not be read where it was made (no network), so every file is
checked against its host's published hash, and a host that publishes none is refused."""

_BLOCK = 1 << 20
_RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RemoteFile:
    """One published file and where it goes.

    Attributes:
        repo: The Hugging Face dataset repository.
        path: The file's path in it.
        target: Where it is written, relative to ``OUT``.
    """

    repo: str
    path: str
    target: str

    def url(self, base_url: str, revision: str) -> str:
        return f"{base_url.rstrip('/')}/datasets/{self.repo}/resolve/{revision}/{self.path}"


def catalog() -> dict[str, list[RemoteFile]]:
    """Every name ``get`` accepts, with the files it fetches."""
    names: dict[str, list[RemoteFile]] = {
        name: [
            RemoteFile(FLASHRAG_REPO, f"{name}/{split}.jsonl", f"{name}/{split}.jsonl") for split in splits
        ]
        for name, splits in QA_SETS.items()
    }
    names[CORPUS] = [RemoteFile(CORPUS_REPO, "wiki-18.jsonl.gz", f"{CORPUS}/wiki-18.jsonl.gz")]
    names[INDEX] = [RemoteFile(INDEX_REPO, part, f"{CORPUS}/{part}") for part in ("part_aa", "part_ab")]
    return names


def _unknown(name: str, known: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"no data named {name!r}: {hint}choose from {', '.join(known)}")


# -- one file ----------------------------------------------------------------------------------------------


def _opener() -> tuple[Any, list[Any]]:
    """A URL opener that follows redirects and keeps the headers of each redirect response (Hugging Face
    publishes a large file's hash on the redirect, not on the storage host's final response), and that list."""
    import urllib.request

    seen: list[Any] = []

    class KeepRedirectHeaders(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            seen.append(headers)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return urllib.request.build_opener(KeepRedirectHeaders()), seen


def _published_hash(chain: Sequence[Any]) -> tuple[str, str] | None:
    """``(kind, hex)`` of the hash the host publishes for a file, from the responses of one request in
    order: ``("sha256", …)`` from ``X-Linked-Etag`` or a 64-digit ``ETag``, ``("git-sha1", …)`` from a
    40-digit ``ETag`` (a git blob's SHA-1); ``None`` when no response says."""
    for header in ("X-Linked-Etag", "ETag"):
        for headers in chain:
            value = headers.get(header)
            if not value:
                continue
            value = value.strip().removeprefix("W/").strip('"').lower()
            if re.fullmatch(r"[0-9a-f]{64}", value):
                return "sha256", value
            if re.fullmatch(r"[0-9a-f]{40}", value):
                return "git-sha1", value
    return None


def _published_size(chain: Sequence[Any], response: Any, offset: int) -> int | None:
    for headers in chain:
        if (linked := headers.get("X-Linked-Size")) and linked.isdigit():
            return int(linked)
    if response.status == 206 and (
        whole := re.search(r"/(\d+)\s*$", response.headers.get("Content-Range", ""))
    ):
        return int(whole[1])
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.isdigit() else None


def _hashes(path: Path) -> tuple[str, str]:
    """The file's SHA-256 and its git blob SHA-1 (``sha1(b"blob SIZE\\0" + content)``), in one read."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while block := f.read(_BLOCK * 4):
            sha256.update(block)
            sha1.update(block)
    return sha256.hexdigest(), sha1.hexdigest()


def fetch_file(
    url: str,
    target: Path,
    *,
    retries: int = 5,
    retry_wait: float = 2.0,
    timeout: float = 60.0,
    progress: bool = True,
    note: Callable[[str], None] = lambda text: print(f"note: {text}", file=sys.stderr),
    pinned: str | None = None,
    accept_unverified: bool = False,
) -> dict[str, Any]:
    """Downloads ``url`` to ``target``: resumable, retried, verified against a pinned or the host's published
    hash.

    Args:
        url: The file's address.
        target: Where it goes; ``TARGET.partial`` holds it until it is complete and verified (an earlier,
            interrupted run's ``.partial`` is continued).
        retries: Attempts after a dropped connection, a timeout or a 5xx/429 answer, each resuming where the
            last stopped; the wait doubles from ``retry_wait`` seconds (at most 60).
        timeout: Seconds a connection may stay silent.
        progress: Show a progress bar.
        note: Where the retry notes go (and the note on a file taken unverified).
        pinned: The SHA-256 the file must have (:data:`PINNED_SHA256`), whatever the host publishes.
        accept_unverified: Take a file that is not pinned and whose host publishes no hash, unchecked.

    Returns:
        What the record keeps: ``url``, ``bytes``, ``sha256`` and ``checked`` (``"pinned"``, or the
        published hash it matched, ``"sha256"`` or ``"git-sha1"``, or ``None`` for a file taken unverified).

    Raises:
        DownloadError: the host refused the file (a 4xx answer), the retries ran out, or the file is not
            pinned and the host publishes no hash for it (without ``accept_unverified``; nothing is written).
        DataFormatError: the file's hash or size differs from the pinned or published one (the download is
            deleted).
    """
    import http.client  # the network modules load only when a file is fetched
    import urllib.error
    import urllib.request

    from tqdm.auto import tqdm

    with _resumable(target) as partial:
        published: tuple[str, str] | None = None
        size: int | None = None
        failures = 0
        answered = False  # a host that never answered is not retried: it is down, or the address is wrong
        bar = tqdm(desc=target.name, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress)
        with bar:
            while True:
                offset = partial.stat().st_size
                opener, redirects = _opener()
                request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
                try:
                    with opener.open(request, timeout=timeout) as response:
                        answered = True
                        chain = [*redirects, response.headers]
                        if response.status != 206:
                            offset = 0  # the host sent the whole file: start it again
                        published = _published_hash(chain) or published
                        if pinned is None and published is None and not accept_unverified:
                            if not partial.stat().st_size:  # nothing of it is left behind
                                partial.unlink()
                            raise DownloadError(
                                f"{url}: the host publishes no hash for this file and searchgym pins none, so "
                                "it cannot be verified: refused before reading it (--accept-unverified takes "
                                "it unchecked)"
                            )
                        size = _published_size(chain, response, offset) or size
                        bar.reset(total=size)
                        bar.update(offset)
                        with partial.open("r+b" if offset else "wb") as f:
                            f.seek(offset)
                            f.truncate()
                            while block := response.read(_BLOCK):
                                f.write(block)
                                bar.update(len(block))
                    got = partial.stat().st_size
                    if size is None or got >= size:
                        break
                    raise http.client.IncompleteRead(b"", size - got)  # the host closed the body early
                except urllib.error.HTTPError as e:
                    answered = True
                    if e.code == 416 and size is not None and partial.stat().st_size == size:
                        break  # asked to resume past the end: the file was already complete
                    if e.code not in _RETRYABLE_STATUS:
                        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
                    failure = f"HTTP {e.code}"
                except urllib.error.URLError as e:
                    if not answered:
                        raise DownloadError(
                            f"{url}: cannot reach the host ({e.reason}); check --base-url and the network"
                        ) from None
                    failure = str(e.reason)
                except (http.client.HTTPException, ConnectionError, TimeoutError) as e:
                    failure = (
                        "the connection dropped"
                        if isinstance(e, http.client.IncompleteRead)
                        else str(e) or type(e).__name__
                    )
                failures += 1
                if failures > retries:
                    raise DownloadError(
                        f"{url}: {failure}, {retries} retries spent; {partial.stat().st_size} bytes kept in "
                        f"{partial}: run the same command again to continue"
                    )
                wait = min(60.0, retry_wait * 2 ** (failures - 1))
                note(
                    f"{target.name}: {failure} at {partial.stat().st_size} bytes; resuming in {wait:g} s "
                    f"(retry {failures} of {retries})"
                )
                time.sleep(wait)
        got = partial.stat().st_size
        sha256, sha1 = _hashes(partial)
        problem = None
        if pinned is not None:
            if sha256 != pinned:
                problem = f"sha256 {sha256} where searchgym pins {pinned}"
        elif size is not None and got != size:
            problem = f"{got} bytes where the host published {size}"
        elif published is not None and published[1] != (sha256 if published[0] == "sha256" else sha1):
            problem = f"{published[0]} {sha256 if published[0] == 'sha256' else sha1} where the host published {published[1]}"
        if problem is not None:
            partial.unlink()
            raise DataFormatError(
                str(target),
                None,
                f"download of {url} refused: {problem}; it was deleted, run the command again",
            )
    checked = "pinned" if pinned is not None else published[0] if published else None
    if checked is None:
        note(f"{target.name}: taken unverified (--accept-unverified): sha256 {sha256}")
    return {"url": url, "bytes": got, "sha256": sha256, "checked": checked}


@contextlib.contextmanager
def _resumable(target: Path) -> Iterator[Path]:
    """:func:`~searchgym.data.jsonl.replace_on_success` with ``keep`` (a later run continues what this one
    wrote), except that a download that fails before its first byte leaves no empty ``TARGET.partial``."""
    entered = False
    try:
        with replace_on_success(target, keep=True) as partial:
            entered = True
            yield partial
    except BaseException:
        left = target.with_name(target.name + PARTIAL_SUFFIX)
        with contextlib.suppress(OSError):
            if entered and left.stat().st_size == 0:
                left.unlink()
        raise


# -- a whole request ---------------------------------------------------------------------------------------


def _read_record(out: Path) -> dict[str, Any]:
    try:
        record = json.loads((out / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(out: Path, record: dict[str, Any]) -> None:
    with replace_on_success(out / RECORD) as partial:
        partial.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _gunzip(source: Path, target: Path) -> None:
    """Decompresses ``source`` into ``target`` (written whole or not at all)."""
    try:
        with replace_on_success(target) as partial, gzip.open(source, "rb") as f, partial.open("wb") as out:
            shutil.copyfileobj(f, out, _BLOCK)
    except (OSError, EOFError) as e:
        raise DataFormatError(str(source), None, f"cannot decompress: {e}") from None


def _concatenate(parts: Sequence[Path], target: Path) -> None:
    with replace_on_success(target) as partial, partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, _BLOCK)


def _link_corpus(out: Path) -> list[str]:
    """Links ``OUT/wiki-18/corpus.jsonl`` into every QA folder of ``OUT`` that has no corpus, so each is a
    FlashRAG folder; returns the folders linked."""
    corpus = out / CORPUS / "corpus.jsonl"
    linked: list[str] = []
    if not corpus.is_file():
        return linked
    for name in QA_SETS:
        folder = out / name
        if folder.is_dir() and not (folder / "corpus.jsonl").exists():
            (folder / "corpus.jsonl").symlink_to(Path("..") / CORPUS / "corpus.jsonl")
            linked.append(name)
    return linked


def get(
    names: Sequence[str],
    out: str | Path,
    *,
    base_url: str = DEFAULT_BASE_URL,
    revision: str = "main",
    retries: int = 5,
    retry_wait: float = 2.0,
    timeout: float = 60.0,
    progress: bool = True,
    accept_unverified: bool = False,
) -> dict[str, Any]:
    """Fetches the named QA sets, corpus and index into ``out`` as FlashRAG folders.

    A QA set goes to ``OUT/NAME/{split}.jsonl``; the corpus to ``OUT/wiki-18/corpus.jsonl``, linked into every
    QA folder of ``OUT`` as its ``corpus.jsonl``; the e5 index to ``OUT/wiki-18/e5_Flat.index``. Files the
    record says were fetched, and that are still there, are not fetched again.

    Args:
        names: From :func:`catalog` (``nq``, ``hotpotqa``, …, ``wiki-18``, ``wiki-18-e5``).
        out: The folder to write.
        base_url: The host (Hugging Face, or a mirror with its layout).
        revision: The repositories' branch, tag or commit.
        retries, retry_wait, timeout, progress, accept_unverified: As :func:`fetch_file` (each file's
            pinned digest comes from :data:`PINNED_SHA256`).

    Returns:
        ``{"out", "fetched", "kept", "folders", "no_corpus"}``: the files downloaded now and those already
        there, the FlashRAG folders ready to read, and QA folders still without a corpus.

    Raises:
        ConfigError: an unknown name (the message suggests the closest one) or no name at all.
        DownloadError, DataFormatError: as :func:`fetch_file`.
    """
    known = catalog()
    if not names:
        raise ConfigError(f"name what to fetch: {', '.join(known)}")
    for name in names:
        if name not in known:
            raise _unknown(name, list(known))
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    record = _read_record(root)
    fetched: list[str] = []
    kept: list[str] = []
    for name in dict.fromkeys(names):
        for remote in known[name]:
            target = root / remote.target
            if name == CORPUS and (root / CORPUS / "corpus.jsonl").is_file() and remote.target in record:
                kept.append(remote.target)
                continue
            if name == INDEX and (root / CORPUS / "e5_Flat.index").is_file() and remote.target in record:
                kept.append(remote.target)
                continue
            entry = record.get(remote.target)
            if target.is_file() and isinstance(entry, dict) and entry.get("bytes") == target.stat().st_size:
                kept.append(remote.target)
                continue
            record[remote.target] = fetch_file(
                remote.url(base_url, revision),
                target,
                retries=retries,
                retry_wait=retry_wait,
                timeout=timeout,
                progress=progress,
                pinned=PINNED_SHA256.get(f"{remote.repo}/{remote.path}"),
                accept_unverified=accept_unverified,
            )
            _write_record(root, record)
            fetched.append(remote.target)
        if name == CORPUS:
            packed = root / CORPUS / "wiki-18.jsonl.gz"
            if packed.is_file():
                if progress:  # minutes for the full corpus, with no bar of its own
                    print(f"unpacking {packed} into corpus.jsonl", file=sys.stderr)
                _gunzip(packed, root / CORPUS / "corpus.jsonl")
                packed.unlink()
        if name == INDEX:
            parts = [root / remote.target for remote in known[INDEX]]
            if all(p.is_file() for p in parts):
                _concatenate(parts, root / CORPUS / "e5_Flat.index")
                for part in parts:
                    part.unlink()
    _link_corpus(root)
    folders = [n for n in QA_SETS if (root / n / "corpus.jsonl").is_file()]
    no_corpus = [n for n in QA_SETS if (root / n).is_dir() and n not in folders]
    return {"out": str(root), "fetched": fetched, "kept": kept, "folders": folders, "no_corpus": no_corpus}
