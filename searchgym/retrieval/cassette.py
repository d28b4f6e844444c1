"""Retrieval cassettes: record every search of a run to a compact file, replay it with no index at all.

A :class:`Cassette` wraps a retriever. In ``"record"`` mode it passes searches to the inner retriever and
keeps each ``(query, k)`` and its results (passage ids, titles, texts, scores); ``save()`` (or ``close()``)
writes them to a gzip-compressed JSON file in which every passage is stored once. In ``"replay"`` mode it
answers from the file alone — no corpus index, no server — and a search the file does not hold raises
:class:`CassetteMissError` naming it. ``"record-missing"`` replays what the file holds and sends the rest
to the inner retriever, adding it.

Repeated searches are answered with their first recorded results, also while recording: a recorded run and
its replay see identical results even when the inner retriever is not deterministic (an approximate index
behind a server), so replayed episodes are bit-identical to the recorded ones.

As a retriever spec (``gym.make(..., retriever=...)``, ``--retriever``): ``"cassette:PATH"`` replays PATH;
``"cassette:PATH;record=SPEC"`` records the retriever SPEC (``bm25``, a URL, ``dense:DIR`` …) to PATH and
``"cassette:PATH;record-missing=SPEC"`` fills PATH's gaps from SPEC.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from searchgym.data.jsonl import parse_json, replace_on_success
from searchgym.data.limits import read_limits
from searchgym.errors import ConfigError, DataFormatError, RetrieverError, SearchGymError
from searchgym.integrity import content_sha256
from searchgym.retrieval.base import Hit, Retriever

__all__ = ["CASSETTE_FORMAT", "Cassette", "CassetteMissError", "cassette_from_spec"]

CASSETTE_FORMAT = "searchgym-cassette"
CASSETTE_VERSION = 1
MODES = ("record", "replay", "record-missing")

CassetteMode = Literal["record", "replay", "record-missing"]


class CassetteMissError(SearchGymError, KeyError):
    """A replayed cassette holds no results for a search.

    Not a :class:`~searchgym.errors.RetrieverError`: ``on_retrieval_error="observe"`` must not turn a
    replay that diverged from its recording into a tool message.

    Attributes:
        query: The search's query.
        k: The number of passages asked for.
    """

    def __init__(self, query: str, k: int, message: str) -> None:
        super().__init__(message)
        self.query = query
        self.k = k

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else ""


class Cassette(Retriever):
    """Records the searches of a run, or replays them (see the module docstring).

    Args:
        inner: The retriever to record (``"record"``, ``"record-missing"``); ``None`` in ``"replay"``
            mode. The cassette owns it: :meth:`close` closes it.
        path: The cassette file (gzip JSON; ``.json.gz`` by convention).
        mode: ``"record"`` (start empty; the file is written by :meth:`save`/:meth:`close`), ``"replay"``
            (the file must exist; nothing is written) or ``"record-missing"`` (the file is read when it
            exists, and written back with the additions).

    Raises:
        ConfigError: an unknown mode, a recording mode without ``inner``, or replay of a missing file.
        DataFormatError: the file is not a cassette.
    """

    name = "cassette"

    def __init__(
        self, inner: Retriever | None, path: str | os.PathLike[str], mode: CassetteMode = "replay"
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"cassette mode must be one of {list(MODES)}, got {mode!r}")
        if mode != "replay" and inner is None:
            raise ConfigError(f"a cassette in {mode!r} mode needs the retriever to record (inner)")
        self.inner = inner
        self.path = Path(path)
        self.mode: CassetteMode = mode
        # passage id -> (title, text, raw contents or None); (query, k) -> [(passage id, score), ...]
        self._passages: dict[str, tuple[str, str, str | None]] = {}
        self._searches: dict[tuple[str, int], list[tuple[str, float]]] = {}
        self._dirty = False
        self.hits = 0
        """Searches answered from the cassette."""
        self.misses = 0
        """Searches sent to the inner retriever."""
        if mode == "replay" and not self.path.is_file():
            raise ConfigError(f"cassette {str(self.path)!r} does not exist (record one with mode='record')")
        if mode != "record" and self.path.is_file():
            self._load()

    # -- searching ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Recorded searches."""
        return len(self._searches)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        missing = list(dict.fromkeys(q for q in queries if (q, k) not in self._searches))
        if missing:
            if self.mode == "replay":
                raise self._miss(missing[0], k)
            assert self.inner is not None
            results = self.inner.search(missing, k)  # one batched call for every new search
            for query, hits in zip(missing, results, strict=True):
                self._add(query, k, hits)
            self.misses += len(missing)
        self.hits += len(queries) - len(missing)
        return [self._hits(query, k) for query in queries]

    def _miss(self, query: str, k: int) -> CassetteMissError:
        recorded = sorted(kk for q, kk in self._searches if q == query)
        why = f"it holds this query with k={recorded}" if recorded else "it holds no search of this query"
        return CassetteMissError(
            query,
            k,
            f"cassette {str(self.path)!r} has no results for query {query!r} with k={k} ({why}); the run "
            "diverged from the recorded one. Replay with the recorded settings, or use "
            "mode='record-missing' (retriever='cassette:PATH;record-missing=SPEC') to fill the gap",
        )

    def _add(self, query: str, k: int, hits: Sequence[Hit]) -> None:
        for h in hits:
            if not math.isfinite(h.score):  # a replay checks its scores are finite: record only those
                raise RetrieverError(
                    f"the retriever answered {query!r:.60} with score {h.score!r} for passage {h.passage_id!r}; "
                    f"cassette {str(self.path)!r} records finite scores only"
                )
        for h in hits:
            if h.passage_id not in self._passages:
                self._passages[h.passage_id] = (h.title, h.text, h.raw_contents)
        self._searches[(query, k)] = [(h.passage_id, h.score) for h in hits]
        self._dirty = True

    def _hits(self, query: str, k: int) -> list[Hit]:
        passages = self._passages
        out = []
        for pid, score in self._searches[(query, k)]:
            title, text, raw = passages[pid]
            out.append(Hit(pid, title, text, score, raw))
        return out

    # -- the file ----------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The cassette as a JSON-serialisable dict (the file's content before compression).

        Its ``sha256`` is the SHA-256 of the rest (:func:`~searchgym.integrity.content_sha256`): an edit after the
        recording is refused on load (a cassette without one, or re-hashed by whoever edited it, loads
        checked by type only). A passage's raw ``contents`` is stored only when it differs from the
        ``"title"\\ntext`` it would
        default to (``1`` stands for that default), which halves the text a typical corpus needs.
        """
        passages: dict[str, list[Any]] = {}
        for pid, (title, text, raw) in self._passages.items():
            passages[pid] = [title, text, 1 if raw == f'"{title}"\n{text}' else raw]
        document = {
            "format": CASSETTE_FORMAT,
            "version": CASSETTE_VERSION,
            "retriever": getattr(self.inner, "name", None) if self.inner is not None else None,
            "passages": passages,
            "searches": [
                [q, k, [[pid, score] for pid, score in hits]] for (q, k), hits in self._searches.items()
            ],
        }
        return {**document, "sha256": content_sha256(document)}

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Writes the cassette (through ``PATH.partial``, renamed over PATH when complete); returns its path.

        The bytes are a function of the recorded searches alone (gzip without a time stamp), so two
        identical runs write identical files.
        """
        target = Path(path) if path is not None else self.path
        data = json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        with (
            replace_on_success(target) as partial,
            partial.open("wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz,
        ):
            gz.write(data)
        if target == self.path:
            self._dirty = False
        return target

    def _load(self) -> None:
        """Reads the file: gzip inflated within the file limit (:mod:`searchgym.data.limits`), parsed by
        :func:`~searchgym.data.jsonl.parse_json`, and every field checked for its type, so a damaged or
        crafted cassette is one :class:`~searchgym.errors.DataFormatError` and never replays altered values."""
        where = str(self.path)
        limits = read_limits()
        try:
            with gzip.open(self.path, "rb") as f:
                raw = f.read(limits.file_bytes + 1)
        except (OSError, EOFError, zlib.error) as e:
            raise DataFormatError(where, None, f"not a readable cassette (gzip JSON): {e}") from None
        if len(raw) > limits.file_bytes:
            raise limits.file_too_large(self.path, "inflates to")
        data = parse_json(raw, self.path, None)
        if not isinstance(data, dict) or data.get("format") != CASSETTE_FORMAT:
            raise DataFormatError(where, None, f"not a searchgym cassette (no format {CASSETTE_FORMAT!r})")
        if "sha256" in data:
            try:
                sealed = content_sha256({k: v for k, v in data.items() if k != "sha256"}) == data["sha256"]
            except (ValueError, TypeError, RecursionError):
                sealed = False
            if not sealed:
                raise DataFormatError(
                    where,
                    None,
                    "fails its checksum (edited or damaged after it was recorded); record it again",
                )
        if data.get("version") != CASSETTE_VERSION:
            raise DataFormatError(
                where,
                None,
                f"cassette version {str(data.get('version'))[:20]!r}; this searchgym reads {CASSETTE_VERSION}",
            )
        passages, searches = data.get("passages"), data.get("searches")
        if not isinstance(passages, dict):
            raise DataFormatError(where, None, f"'passages' must be an object, not {type(passages).__name__}")
        if not isinstance(searches, list):
            raise DataFormatError(where, None, f"'searches' must be a list, not {type(searches).__name__}")
        for pid, entry in passages.items():
            if not (isinstance(entry, list) and len(entry) == 3):
                raise DataFormatError(where, None, f"passage {pid!r:.40} must be [title, text, contents]")
            title, text, raw_contents = entry
            if not isinstance(title, str) or not isinstance(text, str):
                raise DataFormatError(where, None, f"passage {pid!r:.40}: its title and text must be strings")
            if type(raw_contents) is int and raw_contents == 1:
                raw_contents = f'"{title}"\n{text}'
            elif not isinstance(raw_contents, str | None):
                raise DataFormatError(
                    where,
                    None,
                    f"passage {pid!r:.40}: its contents must be a string, null or 1 (the default)",
                )
            self._passages[pid] = (title, text, raw_contents)
        for number, search in enumerate(searches, start=1):
            if not (isinstance(search, list) and len(search) == 3):
                raise DataFormatError(where, None, f"search {number} must be [query, k, hits]")
            query, k, hits = search
            if not isinstance(query, str) or isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise DataFormatError(where, None, f"search {number}: its query must be a string and k >= 1")
            if not isinstance(hits, list) or not all(isinstance(h, list) and len(h) == 2 for h in hits):
                raise DataFormatError(
                    where, None, f"search {number} ({query!r:.40}): hits must be [id, score]s"
                )
            entries = []
            for pid, score in hits:
                if not isinstance(pid, str) or pid not in self._passages:
                    raise DataFormatError(
                        where, None, f"search {query!r:.40} names unknown passage {pid!r:.40}"
                    )
                if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
                    raise DataFormatError(
                        where, None, f"search {query!r:.40}: passage {pid!r:.40} has score {score!r:.40}"
                    )
                entries.append((pid, float(score)))
            if (query, k) in self._searches:
                raise DataFormatError(where, None, f"search {query!r:.40} with k={k} is recorded twice")
            self._searches[(query, k)] = entries

    def close(self) -> None:
        """Writes what was recorded (unless replaying) and closes the inner retriever."""
        if self._dirty and self.mode != "replay":
            self.save()
        if self.inner is not None:
            self.inner.close()


def cassette_from_spec(spec: str, build: Callable[[str], Retriever]) -> Cassette:
    """The cassette of a ``"cassette:PATH[;record=SPEC | ;record-missing=SPEC]"`` retriever spec.

    Args:
        spec: The spec string.
        build: Makes the inner retriever from its spec (``make_retriever`` over the env's corpus).

    Raises:
        ConfigError: a malformed spec, or replay of a missing file.
    """
    body = spec[len("cassette:") :]
    path, sep, option = body.partition(";")
    if not path:
        raise ConfigError(f"retriever {spec!r} names no cassette file: write cassette:PATH")
    if not sep:
        return Cassette(None, path, "replay")
    mode, eq, inner = option.partition("=")
    if mode not in ("record", "record-missing") or not eq or not inner:
        raise ConfigError(
            f"bad cassette spec {spec!r}: write cassette:PATH (replay), cassette:PATH;record=SPEC or "
            "cassette:PATH;record-missing=SPEC, SPEC being the retriever to record (bm25, a URL, …)"
        )
    return Cassette(build(inner), path, "record" if mode == "record" else "record-missing")
