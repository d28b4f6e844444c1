"""The BM25 index: the weight matrix built from a corpus, and its saved form (format, writing, reading).

Scoring. For a passage ``d`` of ``|d|`` tokens and a query term ``t`` occurring ``tf`` times in ``d``::

    w(t, d) = idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * |d| / avgdl))
    score(q, d) = sum over the query's tokens t (repeats count) of w(t, d)

with two idf variants (``N`` passages, ``df`` passages containing ``t``):

* ``"lucene"`` (default): ``log(1 + (N - df + 0.5) / (df + 0.5))``, always positive;
* ``"okapi"``: ``log(N - df + 0.5) - log(df + 0.5)``, where a negative value (a term in more than half of
  the passages) is replaced by ``epsilon`` times the average idf of the vocabulary — exactly what
  ``rank_bm25.BM25Okapi`` does, so this mode reproduces its scores.

All ``w(t, d)`` are computed once at indexing time (:func:`count_terms`, then :func:`weigh`) into a
``(V, N)`` CSR matrix: one row per term, its posting list, sorted by passage, with the weights. The search
over it is :class:`~searchgym.retrieval.bm25.BM25Retriever`'s.

Saved, an index is two files in a folder: ``bm25.npz`` (the matrix's three arrays, stored uncompressed) and
``bm25.json`` (format version, parameters, analyzer, vocabulary, the corpus hash, and SHA-256 seals).
:func:`write_index` writes them atomically; :func:`read_index` checks everything a sparse product trusts
before it hands the matrix over.
"""

from __future__ import annotations

import hashlib
import json
import os
import tokenize
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import scipy.sparse as sp

from searchgym.data.types import Passage
from searchgym.errors import ConfigError, DataFormatError
from searchgym.integrity import (
    check_seal,
    check_sealed_file,
    disk_full_is_clear,
    remove_stale_temp_files,
    seal,
    temp_path,
)
from searchgym.retrieval.base import Analyzer

__all__ = [
    "INDEX_FORMAT",
    "BM25Params",
    "IdfVariant",
    "SavedIndex",
    "corpus_hash",
    "count_terms",
    "read_index",
    "weigh",
    "write_index",
]

IdfVariant = Literal["lucene", "okapi"]

#: Bumped when the saved layout changes; a saved index of another version is rebuilt, not misread.
#: 2: ``bm25.json`` records the SHA-256 of ``bm25.npz`` and of its own content.
INDEX_FORMAT = 2
_META_FILE = "bm25.json"
_ARRAYS_FILE = "bm25.npz"


@dataclass(frozen=True)
class BM25Params:
    """BM25 parameters, validated once.

    The defaults (k1 0.9, b 0.4, Lucene idf) are Anserini's defaults for passage retrieval; with
    :data:`DEFAULT_ANALYZER` they put a gold passage in the top 3 for 0.926 of the HotpotQA check questions.

    Attributes:
        k1: Term-frequency saturation (``>= 0``; 0 ignores term frequency).
        b: Length normalisation in ``[0, 1]`` (0: none, 1: full).
        idf: ``"lucene"`` or ``"okapi"`` (the ``rank_bm25.BM25Okapi`` formula and epsilon floor).
        epsilon: Okapi only: negative idfs become ``epsilon * average idf``.
    """

    k1: float = 0.9
    b: float = 0.4
    idf: IdfVariant = "lucene"
    epsilon: float = 0.25

    def __post_init__(self) -> None:
        if not (isinstance(self.k1, int | float) and self.k1 >= 0):
            raise ConfigError(f"k1 must be a number >= 0, got {self.k1!r}")
        if not (isinstance(self.b, int | float) and 0 <= self.b <= 1):
            raise ConfigError(f"b must be a number in [0, 1], got {self.b!r}")
        if self.idf not in get_args(IdfVariant):
            raise ConfigError(f"idf must be one of {list(get_args(IdfVariant))}, got {self.idf!r}")
        if not (isinstance(self.epsilon, int | float) and self.epsilon >= 0):
            raise ConfigError(f"epsilon must be a number >= 0, got {self.epsilon!r}")


def corpus_hash(passages: Sequence[Passage]) -> str:
    """A SHA-256 over the passages' ids, titles and texts, in order: the identity of an index's corpus.

    Each field is length-prefixed, so no two different corpora can serialise to the same byte stream.
    """
    digest = hashlib.sha256()
    for p in passages:
        for value in (p.id, p.title, p.text):
            data = value.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()


def check_same_corpus(
    meta: dict[str, Any], passages: Sequence[Passage], *, kind: str, root: Path, count_key: str, fix: str
) -> list[Passage]:
    """The passages as a list, once checked to be the corpus the index in ``root`` was built from.

    Args:
        meta: The index's manifest; ``meta["corpus_hash"]`` is the :func:`corpus_hash` it was built from.
        passages: The corpus given now.
        kind: The index's kind, for the message ("BM25", "dense").
        root: The index's folder, for the message.
        count_key: The manifest's field holding the index's number of passages.
        fix: What the user should do, the message's last words.

    Raises:
        ConfigError: a stale index: the corpora differ (both are named by size and hash).
    """
    given = list(passages)
    expected = corpus_hash(given)
    if meta.get("corpus_hash") != expected:
        raise ConfigError(
            f"stale {kind} index in {root}: it was built from a different corpus ({meta.get(count_key)!s:.20} "
            f"passages, hash {str(meta.get('corpus_hash'))[:12]}…) than the one given ({len(given)} passages, "
            f"hash {expected[:12]}…); {fix}"
        )
    return given


def count_terms(
    passages: Sequence[Passage], analyzer: Analyzer, progress: bool
) -> tuple[sp.csr_matrix, dict[str, int]]:
    """The ``(N, V)`` term-frequency matrix of the corpus and the vocabulary (term -> column).

    Each passage is analysed as ``title + " " + text``; ``progress`` shows a bar.
    """
    vocab: dict[str, int] = {}
    lookup = vocab.setdefault
    term_ids: list[int] = []
    indptr = np.zeros(len(passages) + 1, dtype=np.int64)
    items: Any = passages
    if progress:
        from tqdm import tqdm

        items = tqdm(items, desc="indexing BM25", unit="passage", unit_scale=True)
    for i, p in enumerate(items):
        tokens = analyzer(f"{p.title} {p.text}")
        # setdefault with the current size assigns new terms consecutive ids in first-seen order.
        term_ids.extend([lookup(t, len(vocab)) for t in tokens])
        indptr[i + 1] = len(term_ids)
    columns = np.asarray(term_ids, dtype=np.int32)
    ones = np.ones(columns.shape[0], dtype=np.float64)
    tf = sp.csr_matrix((ones, columns, indptr), shape=(len(passages), max(len(vocab), 1)))
    tf.sum_duplicates()  # one entry per (passage, term), holding the term's count
    return tf, vocab


def weigh(tf: sp.csr_matrix, params: BM25Params) -> sp.csr_matrix:
    """The ``(V, N)`` CSR matrix of ``w(t, d)`` from the ``(N, V)`` term-frequency matrix."""
    n_docs, n_terms = tf.shape
    # Passage lengths count every token, repeats included (the row sums of tf).
    lengths = np.asarray(tf.sum(axis=1)).ravel()
    avgdl = lengths.mean() if n_docs and lengths.sum() > 0 else 1.0
    df = np.bincount(tf.indices, minlength=n_terms).astype(np.float64)
    if params.idf == "okapi":
        idf = np.log(n_docs - df + 0.5) - np.log(df + 0.5)
        # rank_bm25 averages the raw idf over the vocabulary, then floors only the negative ones.
        idf[idf < 0] = params.epsilon * idf.mean() if n_terms else 0.0
    else:
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
    rows = np.repeat(np.arange(n_docs), np.diff(tf.indptr))
    freq = tf.data
    k1, b = params.k1, params.b
    # Same operation order as rank_bm25, so the per-term contributions agree to the last bit.
    data = idf[tf.indices] * (freq * (k1 + 1) / (freq + k1 * (1 - b + b * lengths[rows] / avgdl)))
    weights = sp.csr_matrix((data, tf.indices, tf.indptr), shape=tf.shape).T.tocsr()
    weights.sort_indices()
    return weights


# -- the saved index ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedIndex:
    """What :func:`read_index` read: everything a retriever over ``passages`` needs."""

    params: BM25Params
    analyzer: Analyzer
    vocab: dict[str, int]
    weights: sp.csr_matrix
    corpus_hash: str
    passages: list[Passage]


def write_index(
    folder: str | Path,
    weights: sp.csr_matrix,
    vocab: dict[str, int],
    params: BM25Params,
    analyzer: Analyzer,
    corpus: str,
    passages: int,
) -> Path:
    """Writes an index to ``folder`` as :meth:`~searchgym.retrieval.bm25.BM25Retriever.save` describes
    (atomically, the JSON last).

    Args:
        folder: The index folder (created if needed).
        weights: The ``(V, N)`` weight matrix (:func:`weigh`).
        vocab: Term -> row of ``weights``.
        params: The parameters it was weighted with.
        analyzer: The analysis of passages and queries.
        corpus: :func:`corpus_hash` of the passages.
        passages: How many passages (``N``).

    Returns:
        The folder.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(root, (_META_FILE, _ARRAYS_FILE))
    w = weights
    terms = sorted(vocab, key=vocab.__getitem__)
    tmp_arrays, tmp_meta = temp_path(root / _ARRAYS_FILE), temp_path(root / _META_FILE)
    needed = w.data.nbytes + w.indices.nbytes + w.indptr.nbytes + sum(len(t) + 4 for t in terms)
    try:
        with disk_full_is_clear(root / _ARRAYS_FILE, needed, f"the index files in {root} are as they were"):
            with tmp_arrays.open("xb") as f:
                np.savez(f, data=w.data, indices=w.indices, indptr=w.indptr)
                f.flush()
                os.fsync(f.fileno())
            meta = {
                "format": INDEX_FORMAT,
                "params": asdict(params),
                "analyzer": analyzer.to_dict(),
                "corpus_hash": corpus,
                "passages": passages,
                "shape": list(w.shape),
                "vocab": terms,
            }
            meta = seal(meta, {_ARRAYS_FILE: tmp_arrays})
            with tmp_meta.open("x", encoding="utf-8") as f:
                f.write(json.dumps(meta))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_arrays, root / _ARRAYS_FILE)
            os.replace(tmp_meta, root / _META_FILE)
    except BaseException:
        tmp_arrays.unlink(missing_ok=True)
        tmp_meta.unlink(missing_ok=True)
        raise
    return root


def read_index(folder: str | Path, passages: Sequence[Passage], mmap: bool = False) -> SavedIndex:
    """Reads and checks an index written by :func:`write_index` for ``passages``.

    Raises:
        ConfigError: no index in ``folder``, or it was built from a different corpus (stale) or by another
            format version; the message says how to rebuild.
        DataFormatError: the index files are corrupt, fail their checksums (``bm25.json`` its own,
            ``bm25.npz`` the one ``bm25.json`` records), or come from two different builds.
    """
    root = Path(folder)
    meta_path, arrays_path = root / _META_FILE, root / _ARRAYS_FILE
    if not meta_path.is_file() or not arrays_path.is_file():
        raise ConfigError(f"{root} holds no BM25 index (expected {_META_FILE} and {_ARRAYS_FILE})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (
        ValueError,
        UnicodeDecodeError,
        RecursionError,
        OSError,
    ) as e:  # ValueError: integer bombs too
        raise DataFormatError(str(meta_path), None, f"corrupt index metadata ({str(e)[:200]})") from None
    if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ConfigError(
            f"{root} holds a BM25 index of format {found!r:.20}, this version reads {INDEX_FORMAT}; rebuild it"
        )
    check_seal(meta, meta_path)
    given = check_same_corpus(
        meta,
        passages,
        kind="BM25",
        root=root,
        count_key="passages",
        fix=f"rebuild it there (`searchgym index bm25 --corpus CORPUS --out {root} --overwrite`, or `searchgym "
        f"serve --index {root} --overwrite`), or give another folder",
    )
    try:
        shape = tuple(int(s) for s in meta["shape"])
        vocab_list = meta["vocab"]
        if not isinstance(vocab_list, list) or not all(isinstance(t, str) for t in vocab_list):
            raise TypeError("'vocab' must be a list of strings")
        vocab = {t: i for i, t in enumerate(vocab_list)}
        if not isinstance(meta["params"], dict):
            raise TypeError("'params' must be an object")
        params = BM25Params(**meta["params"])
        analyzer = Analyzer.from_dict(meta["analyzer"])
    except (KeyError, TypeError, ValueError, OverflowError, ConfigError) as e:
        raise DataFormatError(str(meta_path), None, f"corrupt BM25 index metadata ({e})") from None
    if len(shape) != 2 or shape[1] != len(given) or shape[0] != max(len(vocab_list), 1):
        raise DataFormatError(
            str(meta_path),
            None,
            f"corrupt BM25 index: shape {shape} does not match the corpus and vocabulary",
        )
    if len(vocab) != len(vocab_list):
        raise DataFormatError(str(meta_path), None, "corrupt BM25 index: the vocabulary repeats a term")
    check_sealed_file(meta, meta_path, arrays_path)
    data, indices, indptr = _read_arrays(arrays_path, mmap)
    _check_csr(arrays_path, data, indices, indptr, shape)
    weights = sp.csr_matrix((data, indices, indptr), shape=shape)
    weights.has_sorted_indices = True  # checked above
    return SavedIndex(params, analyzer, vocab, weights, meta["corpus_hash"], given)


#: The dtypes :func:`write_index` writes (any byte order is accepted).
_ARRAY_DTYPES = {
    "data": (np.dtype(np.float64),),
    "indices": (np.dtype(np.int32), np.dtype(np.int64)),
    "indptr": (np.dtype(np.int32), np.dtype(np.int64)),
}


def _read_arrays(path: Path, mmap: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three CSR arrays of ``bm25.npz``, each checked before it is read: stored uncompressed, a 1-D
    array of the right kind whose header agrees with the member's size (so a crafted header cannot make
    NumPy allocate more than the file holds), and the member's CRC-32 (checked by :mod:`zipfile` on read).
    With ``mmap``, arrays in native byte order are read-only maps of the file instead of copies.

    Raises:
        DataFormatError: anything else, naming the file.
    """
    import zipfile

    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for name, dtypes in _ARRAY_DTYPES.items():
                info = archive.getinfo(f"{name}.npy")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise ValueError(f"{name} is compressed; the index is written uncompressed")
                with archive.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                    elif version == (2, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                    else:
                        raise ValueError(f"{name}: unsupported .npy version {version}")
                    if dtype.newbyteorder("=") not in dtypes or len(shape) != 1 or fortran:
                        expected = " or ".join(str(d) for d in dtypes)
                        raise ValueError(
                            f"{name} is a {dtype} array of shape {shape}, not a 1-D {expected} array"
                        )
                    header_size = f.tell()
                    if header_size + shape[0] * dtype.itemsize != info.file_size:
                        raise ValueError(f"{name}: the header's shape {shape} does not match the stored size")
                    native = dtype.newbyteorder("=")
                    if not mmap or native != dtype:
                        payload = f.read()  # reading to the end checks the member's CRC-32
                        arrays[name] = np.frombuffer(payload, dtype=dtype, count=shape[0]).astype(
                            native, copy=True
                        )
                        continue
                    while f.read(1 << 24):  # the CRC-32 is checked at the end, without a copy kept
                        pass
                # Stored members are the file's own bytes: map them where the .npy payload begins.
                with open(path, "rb") as raw:
                    raw.seek(info.header_offset)
                    local = raw.read(30)
                    if len(local) != 30 or local[:4] != b"PK\x03\x04":
                        raise ValueError(f"{name}: bad local header")
                    skip = int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
                offset = info.header_offset + 30 + skip + header_size
                if offset + shape[0] * dtype.itemsize > path.stat().st_size:
                    raise ValueError(f"{name}: the member runs past the end of the file")
                arrays[name] = (
                    np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(shape[0],))
                    if shape[0]
                    else np.zeros(0, dtype=dtype)
                )
    except (
        zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError, TypeError, OverflowError, SyntaxError,
        tokenize.TokenError,  # NumPy parses a .npy header with tokenize and ast: damage can raise either
    ) as e:  # fmt: skip
        raise DataFormatError(
            str(path), None, f"corrupt BM25 index arrays ({type(e).__name__}: {e})"
        ) from None
    return arrays["data"], arrays["indices"], arrays["indptr"]


def _check_csr(
    path: Path, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, ...]
) -> None:
    """Checks everything sparse products trust without checking: sizes, ranges, order, finiteness.

    Raises:
        DataFormatError: the first violation, naming the file.
    """

    def bad(message: str) -> DataFormatError:
        return DataFormatError(str(path), None, f"corrupt BM25 index: {message}")

    rows, cols = shape
    if len(indptr) != rows + 1:
        raise bad(f"indptr has {len(indptr)} entries for {rows} terms")
    if len(data) != len(indices):
        raise bad(f"{len(data)} weights for {len(indices)} indices")
    if indptr[0] != 0 or int(indptr[-1]) != len(indices) or (np.diff(indptr) < 0).any():
        raise bad("indptr is not a non-decreasing sequence from 0 to the number of entries")
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= cols):
        raise bad(f"a passage index lies outside [0, {cols})")
    if not np.isfinite(data).all():
        raise bad("a weight is not finite")
    if len(indices) > 1:
        rising = np.diff(indices.astype(np.int64)) > 0
        starts = indptr[1:-1].astype(np.int64)
        starts = starts[(starts > 0) & (starts < len(indices))]
        rising[starts - 1] = True  # a new row may start anywhere
        if not rising.all():
            raise bad("a posting list is not sorted by passage, or repeats one")
