"""The saved dense index: its files, the faiss indexes, and the resumable build that writes them.

Passages and queries are embedded by the same :class:`~searchgym.retrieval.encoders.Encoder` (unit float32
vectors), so the inner product of two embeddings is their cosine similarity. The encoder's identity,
pooling and prefixes are saved with the index, so queries are always encoded the way the passages were.

An index folder holds:

* ``embeddings.npy``: the ``(N, dim)`` float32 passage embeddings, in corpus order, memory-mapped on load;
* ``index.faiss``: the faiss index for ``ivf`` and ``hnsw``; ``flat`` needs none: it is an exact
  inner-product scan of the memory-mapped embeddings by BLAS matrix products
  (:func:`~searchgym.retrieval.dense.flat_top_k`), which is what faiss's ``IndexFlatIP`` computes, without
  copying the vectors into an index (and, measured on the development machine, 3.6-5.6x faster at a batch
  of 64 and 2x for one query than faiss-cpu 1.15.1's ``IndexFlatIP`` on 100k-300k vectors, with the same
  results);
* ``dense.json``: the manifest (encoder identity, pooling, prefixes, dimension, corpus hash, count, index
  type), written last and atomically: a folder without it is never loaded as an index;
* ``dense.building.json`` and ``embeddings.partial.npy`` while a build runs: the settings of the build and
  how many passages are encoded so far, so an interrupted build resumes where it stopped.

:func:`build_dense_index` writes a folder; :class:`~searchgym.retrieval.dense.DenseRetriever` reads one.
"""

from __future__ import annotations

import json
import os
import tokenize
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from searchgym.data.types import Passage
from searchgym.errors import ConfigError, DataFormatError, MissingDependencyError
from searchgym.integrity import check_seal, check_sealed_file, remove_stale_temp_files, seal, temp_path
from searchgym.retrieval.bm25_index import corpus_hash
from searchgym.retrieval.encoders import Encoder, load_encoder

__all__ = [
    "BUILDING",
    "EMBEDDINGS",
    "FAISS_FILE",
    "INDEX_FORMAT",
    "INDEX_TYPES",
    "MANIFEST",
    "PARTIAL_EMBEDDINGS",
    "IndexType",
    "build_dense_index",
    "read_manifest",
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


def import_faiss() -> Any:
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


def encoder_difference(built: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
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


def open_embeddings(path: Path, count: int, dim: int, mode: Literal["r", "r+"] = "r") -> np.ndarray:
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
    except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError) as e:  # a damaged .npy header
        raise DataFormatError(str(path), None, f"corrupt embeddings file ({e}); rebuild the index") from None
    if array.dtype != np.float32 or array.shape != (count, dim) or not array.flags.c_contiguous:
        raise DataFormatError(
            str(path),
            None,
            f"the embeddings are a {array.dtype} array of shape {array.shape}, not {count} x {dim} float32; "
            "rebuild the index",
        )
    return array


def finite_float32(path: Path) -> Any:
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


def default_params(index_type: str, count: int) -> dict[str, int]:
    """Search and build parameters of an index type for a corpus of ``count`` passages."""
    if index_type == "ivf":
        # ~4 sqrt(N) lists, with at least 39 training points per list (faiss's own minimum).
        nlist = max(1, min(int(4 * count**0.5), count // 39))
        return {"nlist": nlist, "nprobe": min(nlist, 32)}
    if index_type == "hnsw":
        return {"M": 32, "ef_construction": 80, "ef_search": 128}
    return {}


def build_faiss(
    embeddings: np.ndarray, index_type: str, params: Mapping[str, int], progress: bool, chunk: int = 65536
) -> Any:
    """An ``ivf`` or ``hnsw`` faiss inner-product index over ``embeddings`` (added in chunks)."""
    faiss = import_faiss()
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


def read_faiss(path: Path, meta: Mapping[str, Any]) -> Any:
    """The saved ``ivf``/``hnsw`` index, checked; HNSW vectors are memory-mapped.

    IVF lists are read into memory: faiss 1.15's memory-mapped IVF reading loses the list count.
    """
    faiss = import_faiss()
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


def check_index_params(index_type: str, params: Any, manifest: Path) -> None:
    """The manifest's ``index_params``: exactly the keys of its index type, each a positive integer.

    Raises:
        DataFormatError: naming the bad key.
    """
    expected = set(default_params(index_type, 1_000_000))
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


def check_index_type(index_type: str) -> None:
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
    check_index_type(index_type)
    if index_type != "flat":
        import_faiss()  # before hours of encoding, not after
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
        "index_params": default_params(index_type, len(passages)),
        "rows_done": 0,
    }
    state["rows_done"] = _resume_point(root, state)
    if state["rows_done"] < 0:
        return root  # the same index is already there
    if state["rows_done"] < len(passages) or not (root / EMBEDDINGS).is_file():
        _write_json(root / BUILDING, state)
        _encode_into(root, passages, encoder, state, chunk_size, progress)
    _write_json(root / BUILDING, state)
    embeddings = open_embeddings(root / EMBEDDINGS, len(passages), encoder.dim)
    files = {EMBEDDINGS: root / EMBEDDINGS}
    (root / FAISS_FILE).unlink(missing_ok=True)
    if index_type != "flat":
        faiss = import_faiss()
        index = build_faiss(embeddings, index_type, state["index_params"], progress)
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
    difference = encoder_difference(found.get("encoder") or {}, wanted["encoder"])
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
            open_embeddings(root / EMBEDDINGS, count, state["dim"])  # a damaged finished index is an error
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
        array = open_embeddings(partial, count, dim, mode="r+")
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
