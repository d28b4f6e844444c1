"""Dense retrieval: a resumable index builder and a retriever, exact or approximate (faiss).

Passages and queries are embedded by the same :class:`~searchgym.retrieval.encoders.Encoder` (unit float32
vectors), so the inner product of two embeddings is their cosine similarity. The encoder's identity,
pooling and prefixes are saved with the index, so queries are always encoded the way the passages were.

An index folder holds:

* ``embeddings.npy``: the ``(N, dim)`` float32 passage embeddings, in corpus order, memory-mapped on load;
* ``index.faiss``: the faiss index for ``ivf`` and ``hnsw``; ``flat`` needs none: it is an exact
  inner-product scan of the memory-mapped embeddings by BLAS matrix products (:func:`flat_top_k`), which
  is what faiss's ``IndexFlatIP`` computes, without copying the vectors into an index (and, measured on
  the development machine, 3.6-5.6x faster at a batch of 64 and 2x for one query than faiss-cpu
  1.15.1's ``IndexFlatIP`` on 100k-300k vectors, with the same results);
* ``dense.json``: the manifest (encoder identity, pooling, prefixes, dimension, corpus hash, count, index
  type), written last and atomically: a folder without it is never loaded as an index;
* ``dense.building.json`` and ``embeddings.partial.npy`` while a build runs: the settings of the build and
  how many passages are encoded so far, so an interrupted build resumes where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from searchgym.data.types import Passage, Question
from searchgym.errors import ConfigError, DataFormatError, MissingDependencyError
from searchgym.integrity import check_seal, check_sealed_file, remove_stale_temp_files, seal, temp_path
from searchgym.retrieval.base import Hit, Retriever
from searchgym.retrieval.bm25 import corpus_hash
from searchgym.retrieval.encoders import (
    DEFAULT_PREFIXES,
    POOLINGS,
    TINY,
    Encoder,
    Pooling,
    load_encoder,
    tiny_encoder,
)

__all__ = [
    "DEFAULT_PREFIXES",
    "INDEX_TYPES",
    "POOLINGS",
    "DenseRetriever",
    "Encoder",
    "IndexType",
    "Pooling",
    "build_dense_index",
    "flat_top_k",
    "gold_recall",
    "load_encoder",
    "read_manifest",
    "retriever_from_spec",
    "tiny_encoder",
]

IndexType = Literal["flat", "ivf", "hnsw"]
INDEX_TYPES: tuple[str, ...] = get_args(IndexType)

#: Bumped when the saved layout changes; an index of another version is refused with "rebuild it".
#: 2: the manifest records the SHA-256 of every index file and of its own content.
INDEX_FORMAT = 2
MANIFEST = "dense.json"
BUILDING = "dense.building.json"
EMBEDDINGS = "embeddings.npy"
PARTIAL_EMBEDDINGS = "embeddings.partial.npy"
FAISS_FILE = "index.faiss"
#: The probe embeddings of build and load must agree this closely (cosine); another device or BLAS
#: changes the last digits only.
_PROBE_MIN_COSINE = 0.999


def _import_faiss() -> Any:
    try:
        import faiss
    except ImportError as e:
        raise MissingDependencyError("faiss-cpu", "dense", "Dense retrieval") from e
    return faiss


# -- index files -------------------------------------------------------------------------------------------


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Writes JSON through a temporary file and a rename, so the file is either old or complete."""
    tmp = temp_path(path)
    try:
        with tmp.open("x", encoding="utf-8") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError, OSError) as e:  # ValueError: integer bombs too
        raise DataFormatError(
            str(path), None, f"corrupt dense index metadata ({str(e)[:200]}); rebuild the index"
        ) from None
    if not isinstance(data, dict):
        raise DataFormatError(str(path), None, "corrupt dense index metadata (not a JSON object); rebuild it")
    return data


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    """The manifest of a finished dense index.

    Raises:
        ConfigError: the folder holds no finished index (a half-built one says how to finish it), or one of
            another format version.
        DataFormatError: the manifest is corrupt.
    """
    root = Path(index_dir)
    manifest = root / MANIFEST
    if not manifest.is_file():
        if (root / BUILDING).is_file():
            state = _read_json(root / BUILDING)
            raise ConfigError(
                f"{root} holds a half-built dense index ({state.get('rows_done', '?')} of "
                f"{state.get('count', '?')} passages encoded, no {MANIFEST}); finish it by running the same "
                f"`searchgym index dense ... --out {root}` command again (it resumes), or delete the folder"
            )
        raise ConfigError(
            f"{root} holds no dense index (no {MANIFEST}); build one with "
            f"`searchgym index dense --corpus FOLDER --encoder PATH|tiny --out {root}`"
        )
    meta = _read_json(manifest)
    if meta.get("format") != INDEX_FORMAT:
        raise ConfigError(
            f"{root} holds a dense index of format {meta.get('format')!r:.20}, this version reads {INDEX_FORMAT}; "
            "rebuild it"
        )
    check_seal(meta, manifest)
    return meta


def _encoder_difference(built: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """Why two encoder identities differ (``None`` when they are the same encoder and settings)."""
    for key in ("dim", "pooling", "query_prefix", "passage_prefix", "max_length"):
        if built.get(key) != current.get(key):
            return f"{key} {built.get(key)!r} vs {current.get(key)!r}"
    try:
        probe_a = np.asarray(built.get("probe") or [], dtype=np.float64)
        probe_b = np.asarray(current.get("probe") or [], dtype=np.float64)
        same = (
            probe_a.ndim == 1
            and probe_a.shape == probe_b.shape
            and float(probe_a @ probe_b) >= _PROBE_MIN_COSINE
        )
    except (TypeError, ValueError):  # a damaged record is not the same encoder
        same = False
    if not same:
        return (
            f"encoder {built.get('name')!r} (config {str(built.get('config_hash'))[:12]}…) vs "
            f"{current.get('name')!r} (config {str(current.get('config_hash'))[:12]}…): they embed text "
            "differently"
        )
    return None


def _npy_size(count: int, dim: int) -> int:
    """Bytes of the ``.npy`` file NumPy writes for a C-order ``(count, dim)`` float32 array."""
    import io

    header: dict[str, Any] = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
        "fortran_order": False,
        "shape": (count, dim),
    }
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.tell() + count * dim * 4


def _open_embeddings(path: Path, count: int, dim: int, mode: Literal["r", "r+"] = "r") -> np.ndarray:
    """The memory-mapped ``(count, dim)`` float32 embeddings, checked against the file's size.

    Raises:
        DataFormatError: the file is truncated, padded, or not the array the manifest describes.
    """
    if not path.is_file():
        raise DataFormatError(str(path), None, "the embeddings file is missing; rebuild the index")
    size, expected = path.stat().st_size, _npy_size(count, dim)
    if size != expected:
        raise DataFormatError(
            str(path),
            None,
            f"truncated or corrupt embeddings file ({size} bytes, {expected} expected for {count} x {dim} "
            "float32); rebuild the index",
        )
    try:
        array = np.load(path, mmap_mode=mode, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataFormatError(str(path), None, f"corrupt embeddings file ({e}); rebuild the index") from None
    if array.dtype != np.float32 or array.shape != (count, dim) or not array.flags.c_contiguous:
        raise DataFormatError(
            str(path),
            None,
            f"the embeddings are a {array.dtype} array of shape {array.shape}, not {count} x {dim} float32; "
            "rebuild the index",
        )
    return array


def _finite_float32(path: Path) -> Any:
    """A block callback for :func:`~searchgym.integrity.file_sha256` that refuses NaN and inf in the float32
    payload of a ``.npy`` file (its header is skipped), checked in the same pass as the hash.

    The header's length is a multiple of 64 and blocks start at multiples of 4 MiB, so each block's payload
    starts on a float boundary.
    """
    with path.open("rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        header = f.tell()

    def check(offset: int, block: bytes) -> None:
        start = max(0, header - offset)
        values = np.frombuffer(block, dtype=np.float32, offset=start, count=(len(block) - start) // 4)
        if not np.isfinite(values).all():
            row = offset + start + int(np.argmin(np.isfinite(values))) * 4 - header
            raise DataFormatError(
                str(path), None, f"holds a non-finite value (byte {row} of the vectors); rebuild the index"
            )

    return check


# -- faiss indexes -----------------------------------------------------------------------------------------


def _default_params(index_type: str, count: int) -> dict[str, int]:
    """Search and build parameters of an index type for a corpus of ``count`` passages."""
    if index_type == "ivf":
        # ~4 sqrt(N) lists, with at least 39 training points per list (faiss's own minimum).
        nlist = max(1, min(int(4 * count**0.5), count // 39))
        return {"nlist": nlist, "nprobe": min(nlist, 32)}
    if index_type == "hnsw":
        return {"M": 32, "ef_construction": 80, "ef_search": 128}
    return {}


def _build_faiss(
    embeddings: np.ndarray, index_type: str, params: Mapping[str, int], progress: bool, chunk: int = 65536
) -> Any:
    """An ``ivf`` or ``hnsw`` faiss inner-product index over ``embeddings`` (added in chunks)."""
    faiss = _import_faiss()
    count, dim = embeddings.shape
    if index_type == "ivf":
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, params["nlist"], faiss.METRIC_INNER_PRODUCT)
        # faiss's k-means uses at most 256 points per list; 1M points train even 20k lists well enough.
        sample_size = min(count, max(39 * params["nlist"], min(256 * params["nlist"], 1_000_000)))
        rng = np.random.default_rng(0)
        rows = np.sort(rng.choice(count, size=sample_size, replace=False))
        index.train(np.ascontiguousarray(embeddings[rows]))
    else:
        index = faiss.IndexHNSWFlat(dim, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
    starts: Any = range(0, count, chunk)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=f"adding to the {index_type} index", unit="chunk")
    for start in starts:
        index.add(np.ascontiguousarray(embeddings[start : start + chunk]))
    _set_search_params(index, index_type, params)
    return index


def _set_search_params(index: Any, index_type: str, params: Mapping[str, int]) -> None:
    if index_type == "ivf":
        index.nprobe = params["nprobe"]
    elif index_type == "hnsw":
        index.hnsw.efSearch = params["ef_search"]


def _read_faiss(path: Path, meta: Mapping[str, Any]) -> Any:
    """The saved ``ivf``/``hnsw`` index, checked; HNSW vectors are memory-mapped.

    IVF lists are read into memory: faiss 1.15's memory-mapped IVF reading loses the list count.
    """
    faiss = _import_faiss()
    if not path.is_file():
        raise DataFormatError(str(path), None, "the faiss index file is missing; rebuild the index")
    check_sealed_file(meta, path.parent / MANIFEST, path, record=True)
    flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if meta["index_type"] == "hnsw" else 0
    try:
        index = faiss.read_index(str(path), flags)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1][:200]
        raise DataFormatError(str(path), None, f"corrupt faiss index ({first}); rebuild it") from None
    if index.ntotal != meta["count"] or index.d != meta["dim"]:
        raise DataFormatError(
            str(path),
            None,
            f"the faiss index holds {index.ntotal} vectors of dim {index.d}, the manifest says "
            f"{meta['count']} of dim {meta['dim']}; rebuild it",
        )
    kind = {"ivf": faiss.IndexIVF, "hnsw": faiss.IndexHNSW}[meta["index_type"]]
    if not isinstance(index, kind):
        raise DataFormatError(
            str(path),
            None,
            f"holds a {type(index).__name__}, not the {meta['index_type']} index the manifest names",
        )
    _set_search_params(index, meta["index_type"], meta["index_params"])
    return index


def _check_index_params(index_type: str, params: Any, manifest: Path) -> None:
    """The manifest's ``index_params``: exactly the keys of its index type, each a positive integer.

    Raises:
        DataFormatError: naming the bad key.
    """
    expected = set(_default_params(index_type, 1_000_000))
    if not isinstance(params, dict) or set(params) != expected:
        found = sorted(params) if isinstance(params, dict) else params
        raise DataFormatError(
            str(manifest),
            None,
            f"index_params {found!r:.80} are not those of a {index_type} index ({sorted(expected)})",
        )
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 31:
            raise DataFormatError(
                str(manifest), None, f"index_params {key!r} is {value!r:.40}, not a positive integer"
            )


# -- building ----------------------------------------------------------------------------------------------


def _check_index_type(index_type: str) -> None:
    if index_type not in INDEX_TYPES:
        raise ConfigError(f"unknown index type {index_type!r}; choose one of {list(INDEX_TYPES)}")


def build_dense_index(
    passages: Sequence[Passage],
    encoder: Encoder | str,
    out_dir: str | Path,
    *,
    batch_size: int | None = None,
    index_type: str = "flat",
    progress: bool = True,
    chunk_size: int = 8192,
    overwrite: bool = False,
    device: str = "cpu",
) -> Path:
    """Encodes a corpus and writes a dense index to ``out_dir``; resumes an interrupted build.

    Passages are encoded ``chunk_size`` at a time into ``embeddings.partial.npy``; after each chunk the
    count of finished passages is recorded in ``dense.building.json``. Run again after an interruption, the
    build goes on from there (with the same encoder, settings and corpus; anything else is refused). Once
    every passage is encoded the file becomes ``embeddings.npy``, the ``ivf``/``hnsw`` index is built, and
    ``dense.json`` is written last. A finished index of the same encoder and corpus is reused: nothing is
    done for the same index type, only the faiss index is built for another one.

    Args:
        passages: The corpus.
        encoder: An :class:`Encoder`, ``"tiny"``, or the folder of a checkpoint (see :func:`load_encoder`).
        out_dir: The index folder (created if needed; other files in it are left alone).
        batch_size: Texts per forward pass (default: the encoder's).
        index_type: ``"flat"`` (exact), ``"ivf"`` or ``"hnsw"`` (approximate, for large corpora).
        progress: Show progress bars.
        chunk_size: Passages encoded between two saved checkpoints of the build.
        overwrite: Discard whatever dense index or half-built one ``out_dir`` holds.
        device: Torch device, when ``encoder`` is a name or path.

    Returns:
        ``out_dir``.

    Raises:
        ConfigError: an empty corpus, an unknown index type, or ``out_dir`` holds an index (finished or
            half-built) of another encoder, settings or corpus and ``overwrite`` is false.
    """
    _check_index_type(index_type)
    if index_type != "flat":
        _import_faiss()  # before hours of encoding, not after
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    passages = list(passages)
    if not passages:
        raise ConfigError("the corpus holds no passages; there is nothing to index")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    encoder = load_encoder(encoder, device=device)
    if batch_size is not None:
        encoder.batch_size = batch_size
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(
        root, (MANIFEST, BUILDING, FAISS_FILE, EMBEDDINGS, PARTIAL_EMBEDDINGS, ".verified.json")
    )
    if overwrite:
        _remove(root, (MANIFEST, BUILDING, PARTIAL_EMBEDDINGS, EMBEDDINGS, FAISS_FILE))
    state: dict[str, Any] = {
        "format": INDEX_FORMAT,
        "encoder": encoder.identity(),
        "corpus_hash": corpus_hash(passages),
        "count": len(passages),
        "dim": encoder.dim,
        "index_type": index_type,
        "index_params": _default_params(index_type, len(passages)),
        "rows_done": 0,
    }
    state["rows_done"] = _resume_point(root, state)
    if state["rows_done"] < 0:
        return root  # the same index is already there
    if state["rows_done"] < len(passages) or not (root / EMBEDDINGS).is_file():
        _write_json(root / BUILDING, state)
        _encode_into(root, passages, encoder, state, chunk_size, progress)
    _write_json(root / BUILDING, state)
    embeddings = _open_embeddings(root / EMBEDDINGS, len(passages), encoder.dim)
    files = {EMBEDDINGS: root / EMBEDDINGS}
    (root / FAISS_FILE).unlink(missing_ok=True)
    if index_type != "flat":
        faiss = _import_faiss()
        index = _build_faiss(embeddings, index_type, state["index_params"], progress)
        tmp = temp_path(root / FAISS_FILE)
        try:
            faiss.write_index(index, str(tmp))
            os.replace(tmp, root / FAISS_FILE)
        finally:
            tmp.unlink(missing_ok=True)
        files[FAISS_FILE] = root / FAISS_FILE
    manifest = seal({k: v for k, v in state.items() if k != "rows_done"}, files)
    _write_json(root / MANIFEST, manifest)  # the completion marker, written last
    (root / BUILDING).unlink(missing_ok=True)
    return root


def _remove(root: Path, names: Sequence[str]) -> None:
    for name in names:  # the manifest first: a folder is never a finished index while being cleared
        (root / name).unlink(missing_ok=True)


def _same_build(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """Why a saved build cannot continue into the wanted one (``None``: it can)."""
    if found.get("format") != INDEX_FORMAT:
        return f"format {found.get('format')!r}, this version writes {INDEX_FORMAT}"
    if found.get("corpus_hash") != wanted["corpus_hash"] or found.get("count") != wanted["count"]:
        return (
            f"another corpus ({found.get('count')} passages, hash {str(found.get('corpus_hash'))[:12]}…; "
            f"given: {wanted['count']} passages, hash {wanted['corpus_hash'][:12]}…)"
        )
    difference = _encoder_difference(found.get("encoder") or {}, wanted["encoder"])
    return None if difference is None else f"another encoder ({difference})"


def _resume_point(root: Path, state: Mapping[str, Any]) -> int:
    """Passages already encoded in ``root`` for this build; ``-1`` when the same index is finished.

    Raises:
        ConfigError: ``root`` holds an index or a half-built one that this build cannot reuse.
    """
    count = state["count"]
    if (root / MANIFEST).is_file():
        found = _read_json(root / MANIFEST)
        reason = _same_build(found, state)
        if reason is not None:
            raise ConfigError(
                f"{root} holds a dense index built from {reason}; choose another folder or pass "
                "overwrite=True (--overwrite) to replace it"
            )
        if (
            found.get("index_type") == state["index_type"]
            and found.get("index_params") == state["index_params"]
        ):
            _open_embeddings(root / EMBEDDINGS, count, state["dim"])  # a damaged finished index is an error
            check_seal(found, root / MANIFEST)
            check_sealed_file(found, root / MANIFEST, root / EMBEDDINGS, record=True)
            faiss_file = root / FAISS_FILE
            if state["index_type"] == "flat":
                return -1
            try:
                check_sealed_file(found, root / MANIFEST, faiss_file, record=True)
                return -1
            except DataFormatError:
                pass  # a lost or damaged faiss index: rebuilt below from the (checked) embeddings
        (root / MANIFEST).unlink()  # same embeddings, another (or a lost) faiss index: built below
        return count
    if not (root / BUILDING).is_file():
        _remove(root, (PARTIAL_EMBEDDINGS, EMBEDDINGS))  # leftovers of a build that never recorded a step
        return 0
    found = _read_json(root / BUILDING)
    reason = _same_build(found, state)
    if reason is not None:
        raise ConfigError(
            f"{root} holds a half-built dense index of {reason}; finish it with its own settings, choose "
            "another folder, or pass overwrite=True (--overwrite) to start again"
        )
    done = found.get("rows_done")
    if not isinstance(done, int) or not 0 <= done <= count:
        raise DataFormatError(str(root / BUILDING), None, f"bad rows_done {done!r}; pass --overwrite")
    if done == count and (root / EMBEDDINGS).is_file():
        return count
    if not (root / PARTIAL_EMBEDDINGS).is_file():
        return 0
    return done


def _encode_into(
    root: Path,
    passages: Sequence[Passage],
    encoder: Encoder,
    state: dict[str, Any],
    chunk_size: int,
    progress: bool,
) -> None:
    """Encodes the passages from ``state["rows_done"]`` on into the partial embeddings, chunk by chunk."""
    count, dim = len(passages), encoder.dim
    partial = root / PARTIAL_EMBEDDINGS
    array: Any  # a np.memmap either way
    if state["rows_done"] == 0 or not partial.is_file():
        state["rows_done"] = 0
        array = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=(count, dim))
    else:
        array = _open_embeddings(partial, count, dim, mode="r+")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=count, initial=state["rows_done"], desc="encoding passages", unit="passage")
    while state["rows_done"] < count:
        start = state["rows_done"]
        end = min(start + chunk_size, count)
        array[start:end] = encoder.encode_passages(passages[start:end])
        array.flush()  # on disk before the state says so
        state["rows_done"] = end
        _write_json(root / BUILDING, state)
        if bar is not None:
            bar.update(end - start)
    if bar is not None:
        bar.close()
    del array
    os.replace(partial, root / EMBEDDINGS)


# -- exact search ----------------------------------------------------------------------------------------

#: Score entries (queries x passages) computed at once by :func:`flat_top_k`: 64 MiB of float32.
_FLAT_BLOCK_ENTRIES = 1 << 24


def flat_top_k(vectors: np.ndarray, embeddings: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exact top ``k`` by inner product, ties broken by lower position, for each query vector.

    The passages are scanned in blocks (a memory map is read block by block, never copied whole); each
    block's scores are one BLAS matrix product, and only the entries at or above the block's k-th best
    score (ties included) are kept as candidates.

    Args:
        vectors: ``(B, dim)`` float32 query vectors.
        embeddings: ``(N, dim)`` float32 passage vectors.
        k: How many to keep per query (``1 <= k <= N``).

    Returns:
        For each query, ``(positions, scores)``, each ``(k,)``, best first.
    """
    n, batch = embeddings.shape[0], vectors.shape[0]
    block = max(1024, _FLAT_BLOCK_ENTRIES // max(batch, 1))
    rows, positions, scores = [], [], []
    for start in range(0, n, block):
        part = vectors @ embeddings[start : start + block].T  # (B, m)
        m = part.shape[1]
        if k < m:
            kth = np.partition(part, m - k, axis=1)[:, m - k : m - k + 1]
            row, col = np.nonzero(part >= kth)
        else:
            row, col = np.divmod(np.arange(batch * m), m)
        rows.append(row)
        positions.append(col + start)
        scores.append(part[row, col])
    row, position, score = np.concatenate(rows), np.concatenate(positions), np.concatenate(scores)
    order = np.lexsort((position, -score, row))  # by query, then best score, then lowest position
    starts = np.searchsorted(row[order], np.arange(batch))
    out = []
    for b in range(batch):
        taken = order[starts[b] : starts[b] + k]
        out.append((position[taken].astype(np.int64), score[taken]))
    return out


# -- the retriever -----------------------------------------------------------------------------------------


class DenseRetriever(Retriever):
    """Top-k passages by inner product of normalised embeddings (cosine similarity).

    A batch of queries is encoded in batches of the encoder's ``batch_size`` and searched at once: by
    :func:`flat_top_k` for ``flat`` (exact), by one faiss call for ``ivf``/``hnsw`` (approximate).
    Results are by decreasing score, ties broken by corpus position (exactly, for ``flat``; among the
    candidates the approximate index returns, for ``ivf``/``hnsw``).

    Build one with :meth:`load` (an index folder written by :func:`build_dense_index`), or directly from
    embeddings held in memory (e.g. for a benchmark).

    Args:
        passages: The corpus, in the order of ``embeddings``.
        encoder: Encodes the queries; must produce ``dim``-dimensional vectors.
        embeddings: ``(N, dim)`` float32 unit vectors (may be a memory map).
        index: A faiss index over the embeddings for ``ivf``/``hnsw``; ``None`` for ``flat``.
        index_type: ``"flat"``, ``"ivf"`` or ``"hnsw"``.

    Raises:
        ConfigError: the shapes of the corpus, the embeddings and the encoder disagree.
    """

    name = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        encoder: Encoder,
        embeddings: np.ndarray,
        *,
        index: Any = None,
        index_type: str = "flat",
    ) -> None:
        _check_index_type(index_type)
        if index_type != "flat":
            _import_faiss()  # fail now, naming the extra, rather than at the first search
        self.passages = list(passages)
        if embeddings.ndim != 2 or embeddings.shape[0] != len(self.passages):
            raise ConfigError(
                f"{embeddings.shape} embeddings for {len(self.passages)} passages: one row per passage needed"
            )
        if embeddings.shape[1] != encoder.dim:
            raise ConfigError(
                f"dimension mismatch: the index holds {embeddings.shape[1]}-dimensional vectors but encoder "
                f"{encoder.name!r} produces {encoder.dim}; pass the encoder the index was built with, or "
                "rebuild the index with this one"
            )
        if index_type != "flat" and index is None:
            params = _default_params(index_type, len(self.passages))
            index = _build_faiss(embeddings, index_type, params, progress=False)
        self.encoder = encoder
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        self.index = index
        self.index_type = index_type
        self.index_dir: Path | None = None

    @classmethod
    def load(
        cls,
        index_dir: str | Path,
        passages: Sequence[Passage],
        encoder: Encoder | str | None = None,
        device: str = "cpu",
    ) -> DenseRetriever:
        """Opens an index written by :func:`build_dense_index` (embeddings memory-mapped).

        Args:
            index_dir: The index folder.
            passages: The corpus the index was built from (hits are read from it).
            encoder: The query encoder: ``None`` loads the one recorded in the index (``"tiny"`` or its
                checkpoint folder); a name or folder is loaded with the recorded pooling, prefixes and
                length; an :class:`Encoder` is used as it is (and must match them).
            device: Torch device of the query encoder (not used for an :class:`Encoder`).

        Raises:
            ConfigError: no finished index in ``index_dir`` (a half-built one says how to finish it); it
                was built from another corpus; the encoder is another one or of another dimension; the
                recorded encoder's folder is gone.
            DataFormatError: an index file is truncated or corrupt.
            MissingDependencyError: faiss (for ``ivf``/``hnsw``), torch or transformers is not installed.
        """
        root = Path(index_dir)
        meta = read_manifest(root)
        passages = list(passages)
        expected = corpus_hash(passages)
        if meta.get("corpus_hash") != expected:
            raise ConfigError(
                f"stale dense index in {root}: it was built from a different corpus ({meta.get('count')} "
                f"passages, hash {str(meta.get('corpus_hash'))[:12]}…) than the one given ({len(passages)} "
                f"passages, hash {expected[:12]}…); rebuild it with `searchgym index dense ... --out {root}"
                " --overwrite`"
            )
        try:
            count, dim, index_type = meta["count"], meta["dim"], meta["index_type"]
            for name, value in (("count", count), ("dim", dim)):
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 40:
                    raise TypeError(f"{name} must be a positive integer, got {value!r:.40}")
            if not isinstance(index_type, str):
                raise TypeError(f"index_type must be a string, got {index_type!r:.40}")
            if not isinstance(meta["encoder"], dict):
                raise TypeError("encoder must be an object")
            built = dict(meta["encoder"])
            _check_index_type(index_type)
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise DataFormatError(str(root / MANIFEST), None, f"corrupt dense index manifest ({e})") from None
        _check_index_params(index_type, meta.get("index_params"), root / MANIFEST)
        embeddings = _open_embeddings(root / EMBEDDINGS, count, dim)
        check_sealed_file(
            meta, root / MANIFEST, root / EMBEDDINGS, _finite_float32(root / EMBEDDINGS), record=True
        )
        index = _read_faiss(root / FAISS_FILE, meta) if index_type != "flat" else None
        # A name or path is loaded with the recorded pooling, prefixes and length; an Encoder is used as is.
        options = {
            k: built[k] for k in ("pooling", "query_prefix", "passage_prefix", "max_length") if k in built
        }
        if encoder is None:
            name = str(built.get("name"))
            if name != TINY and not Path(name).is_dir():
                raise ConfigError(
                    f"the index in {root} was built with the encoder in {name}, which is gone; pass "
                    "encoder=PATH to DenseRetriever.load (the same checkpoint, moved), or rebuild the index"
                )
            encoder = load_encoder(name, device=device, **options)
        elif not isinstance(encoder, Encoder):
            encoder = load_encoder(encoder, device=device, **options)
        if encoder.dim != dim:
            raise ConfigError(
                f"dimension mismatch: the index in {root} holds {dim}-dimensional vectors but encoder "
                f"{encoder.name!r} produces {encoder.dim}; pass the encoder the index was built with "
                f"({built.get('name')!r}), or rebuild the index with this one"
            )
        difference = _encoder_difference(built, encoder.identity())
        if difference is not None:
            raise ConfigError(
                f"the index in {root} was built with another encoder than the one given ({difference}); "
                f"pass the encoder it was built with ({built.get('name')!r}), or rebuild the index with "
                "`searchgym index dense ... --overwrite`"
            )
        self = cls(passages, encoder, embeddings, index=index, index_type=index_type)
        self.index_dir = root
        return self

    @property
    def dim(self) -> int:
        """Embedding size."""
        return int(self.embeddings.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the embeddings (memory-mapped when loaded) plus, for ``ivf``/``hnsw``, the faiss index."""
        size = int(self.embeddings.nbytes)
        if self.index is not None:
            if self.index_dir is not None and (self.index_dir / FAISS_FILE).is_file():
                size += (self.index_dir / FAISS_FILE).stat().st_size
            else:
                size += int(_import_faiss().serialize_index(self.index).nbytes)
        return size

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each ``(B, dim)`` query vector, ``(positions, scores)`` of its top ``k`` passages."""
        n = len(self.passages)
        k = min(k, n)
        if k <= 0 or vectors.shape[0] == 0:
            empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
            return [empty for _ in range(vectors.shape[0])]
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.index is None:
            return flat_top_k(vectors, self.embeddings, k)
        scores, positions = self.index.search(vectors, k)
        if positions.size and int(positions.max()) >= n:
            where = self.index_dir / FAISS_FILE if self.index_dir is not None else "the faiss index"
            raise DataFormatError(
                str(where),
                None,
                f"returned passage id {int(positions.max())}, but the corpus holds {n} passages: the index is "
                "corrupt or of another corpus; rebuild it",
            )
        out = []
        for row_scores, row_positions in zip(scores, positions, strict=True):
            valid = row_positions >= 0
            row_scores, row_positions = row_scores[valid], row_positions[valid]
            order = np.lexsort((row_positions, -row_scores))[:k]
            out.append((row_positions[order].astype(np.int64), row_scores[order]))
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        if not queries:
            return []
        if k <= 0:
            return [[] for _ in queries]
        passages = self.passages
        found = self.search_vectors(self.encoder.encode_queries(queries), k)
        return [
            [Hit.of(passages[int(i)], float(s)) for i, s in zip(positions, scores, strict=True)]
            for positions, scores in found
        ]


# -- evaluation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recall:
    """Gold-passage recall of a retriever on a question set.

    Attributes:
        k: Passages retrieved per question.
        any_gold: Share of the questions whose top ``k`` holds at least one gold passage.
        all_gold: Share whose top ``k`` holds every gold passage.
        questions: Questions counted (those with gold passage ids).
    """

    k: int
    any_gold: float
    all_gold: float
    questions: int


def gold_recall(
    retriever: Retriever,
    questions: Sequence[Question],
    k: int = 3,
    *,
    batch_size: int = 256,
    progress: bool = False,
) -> Recall:
    """Recall@k of the gold passages: each question is the query, its ``supporting_ids`` the gold ids.

    Raises:
        ConfigError: no question carries gold passage ids.
    """
    scored = [q for q in questions if q.supporting_ids]
    if not scored:
        raise ConfigError(
            "no question carries gold passage ids (metadata.gold_passage_ids); cannot measure recall"
        )
    any_hits = all_hits = 0
    starts: Iterator[int] | Any = range(0, len(scored), batch_size)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=f"recall@{k}", unit="batch")
    for start in starts:
        batch = scored[start : start + batch_size]
        for q, hits in zip(batch, retriever.search([q.question for q in batch], k), strict=True):
            ids = {h.passage_id for h in hits}
            gold = set(q.supporting_ids)
            any_hits += bool(ids & gold)
            all_hits += gold <= ids
    return Recall(k, any_hits / len(scored), all_hits / len(scored), len(scored))


def retriever_from_spec(spec: Any, passages: Sequence[Passage], device: str = "cpu") -> Retriever | None:
    """The retriever of a ``"dense:INDEX_DIR"`` or ``"hybrid:INDEX_DIR"`` spec; ``None`` for other specs.

    ``hybrid`` fuses :class:`~searchgym.retrieval.bm25.BM25Retriever` over ``passages`` and the dense
    index by reciprocal rank (:class:`~searchgym.retrieval.hybrid.HybridRetriever`).

    Args:
        spec: The retriever argument.
        passages: The corpus the index was built from.
        device: Torch device of the query encoder.

    Raises:
        ConfigError: the spec names no folder, or the index does not fit (see :meth:`DenseRetriever.load`).
    """
    if not isinstance(spec, str) or not spec.startswith(("dense:", "hybrid:")):
        return None
    kind, _, folder = spec.partition(":")
    if not folder:
        raise ConfigError(f"retriever {spec!r} names no index folder; use {kind}:INDEX_DIR")
    dense = DenseRetriever.load(Path(folder).expanduser(), passages, device=device)
    if kind == "dense":
        return dense
    from searchgym.retrieval.bm25 import BM25Retriever
    from searchgym.retrieval.hybrid import HybridRetriever

    return HybridRetriever([BM25Retriever(passages), dense], passages)
