"""Fuzzes the file loaders in this process; run by ``test_fuzz_files.py`` in a child process.

``python fuzz_files_worker.py KIND CASES [--derandomize]`` mutates valid files of KIND (``checkpoint``, ``index``,
``dense``, ``jsonl``, ``parquet``, ``demos``, ``metrics``, ``cassette``, ``partial`` — ``eval --out``'s
``OUT.partial`` with its digests and run record —, ``pairs`` — benchmark's cached pair files) with hypothesis: truncation, bit flips, overwritten,
inserted and deleted bytes, changes of types, dtypes, shapes and values, integer bombs (a JSON integer of
thousands of digits), manifest field changes (re-sealed, as a crafted index is, or not), faiss ids past the
corpus and parquet row bombs. Every case ends in one outcome:

* ``typed error``: a :class:`~searchgym.errors.SearchGymError` (the promise for damaged input);
* ``same results``: it loaded and gives exactly what the undamaged file gives;
* ``silently wrong``: it loaded and gives something else; acceptable only for the mutation families of
  :data:`NO_CHECKSUM`, where no checksum can exist (the reason is printed beside the count);
* ``raw``: any other exception (a bug); ``hang``: a case that ran past :data:`HANG_S` seconds (a bug).

A crash (segfault) kills this process; the test sees the signal. The last line of output is a JSON summary:
the kind, the number of cases, the outcome counts, the counts per mutation family, and the first raw or
hanging cases.
"""

from __future__ import annotations

import io
import json
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.errors import SearchGymError

OUTCOME_NAMES = ("typed error", "same results", "silently wrong", "raw", "hang")
OUTCOMES: Counter[str] = Counter()
FAMILIES: defaultdict[str, Counter[str]] = defaultdict(Counter)
EXAMPLES: list[str] = []
DERANDOMIZE = False
HANG_S = 30.0
"""A case running longer than this is a hang (interrupted by an alarm where Python code is running)."""

NO_CHECKSUM = {
    "checkpoint/fields": "an edit that drops or replaces the seal itself loads as an unsealed (older) checkpoint",
    "checkpoint/config": "a config value of the right type and range is another run's setting: types and ranges "
    "are checked, intent cannot be",
    "index/array (re-sealed)": "a crafted index carries fresh hashes; the checks behind them run, not a checksum",
    "index/meta field (re-sealed)": "as above: crafted and re-sealed",
    "dense/manifest field (re-sealed)": "as above: crafted and re-sealed",
    "jsonl/bytes": "FlashRAG files are the user's data: no checksum exists to compare with",
    "jsonl/record": "the user's data, well-formed with other values",
    "parquet/bytes": "the user's data (parquet's own page checksums are optional and rarely written)",
    "parquet/column": "the user's data, well-formed with other values",
    "demos/bytes": "demonstrations are the user's data (a JSONL file anyone may edit)",
    "demos/record": "the user's data, well-formed with other values",
    "metrics/bytes": "a run's log, appended line by line: no checksum can cover a growing file",
    "metrics/record": "a run's log, well-formed with other values",
    "metrics/integer bomb": "a bad last line is taken for a torn write (a run being written) and skipped, "
    "with a warning",
    "cassette/json bytes": "an edit that damages the cassette's own sha256 field loads as a cassette recorded "
    "without one (its values are still type-checked)",
    "cassette/field": "as above: the sha256 field itself replaced or dropped",
    "cassette/field (re-sealed)": "an edited cassette whose sha256 was recomputed: the hash proves the content "
    "is whole, not who wrote it (its values are still type-checked)",
    "partial/record (re-digested)": "rewritten with fresh digests: they prove the lines belong together, not who "
    "wrote them (the records' types are still checked)",
    "pairs/record (re-digested)": "as above: a pair file crafted with a fresh digest",
}
"""The mutation families where ``silently wrong`` is acceptable, with the reason no checksum can catch them."""

BOMB = "1" + "0" * 5000
"""An integer literal past Python's 4,300-digit limit for int(str)."""


def case_settings(cases: int) -> Any:
    """Hypothesis settings of every kind: ``cases`` examples, no deadline, no example database."""
    return settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=list(HealthCheck),
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def byte_mutation(draw: Any, data: bytes) -> bytes:
    """One random damage to ``data``."""
    n = len(data)
    kind = draw(st.sampled_from(["truncate", "flip", "overwrite", "insert", "delete", "zero_run"]))
    at = draw(st.integers(0, max(n - 1, 0)))
    if kind == "truncate":
        return data[:at]
    if kind == "flip":
        out = bytearray(data)
        out[at] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    if kind == "overwrite":
        chunk = draw(st.binary(min_size=1, max_size=16))
        return data[:at] + chunk + data[at + len(chunk) :]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    if kind == "delete":
        return data[:at] + data[at + draw(st.integers(1, 16)) :]
    length = draw(st.integers(1, 64))
    return data[:at] + b"\0" * min(length, n - at) + data[at + length :]


@st.composite
def integer_bomb(draw: Any, text: str) -> str:
    """JSON ``text`` with one of its integer values (or, with none, a new field) replaced by a 5,001-digit
    integer."""
    value = json.loads(text)
    spots: list[tuple[Any, Any]] = []  # (container, key) of every integer value

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            if isinstance(child, int) and not isinstance(child, bool):
                spots.append((node, key))
            walk(child)

    walk(value)
    if spots and draw(st.booleans()):
        container, key = spots[draw(st.integers(0, len(spots) - 1))]
        container[key] = "@BOMB@"
    elif isinstance(value, dict):
        value["bomb"] = "@BOMB@"
    else:
        value = {"bomb": "@BOMB@", "value": value}
    return json.dumps(value).replace('"@BOMB@"', BOMB) + ("\n" if text.endswith("\n") else "")


class Hang(BaseException):
    """Raised by the alarm in a case that runs past :data:`HANG_S`."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def run(
    family: str, case: Callable[[], Any], reference: Any, same: Callable[[Any, Any], bool] | None = None
) -> None:
    """Runs one case of a mutation family and records its outcome.

    ``case()`` loads the mutated file and returns what a user would get from it (the loaded content, or the
    answers of a loaded index), compared with ``reference`` (what the undamaged file gives) by ``same``
    (default ``==``).
    """
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    start = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = case()
        equal = (same or (lambda a, b: bool(a == b)))(result, reference)
        outcome = "same results" if equal else "silently wrong"
    except SearchGymError:
        outcome = "typed error"
    except Hang:
        outcome = "hang"
    except Exception as e:
        outcome = "raw"
        if len(EXAMPLES) < 5:
            EXAMPLES.append(f"{family}: {type(e).__name__}: {str(e)[:300]}\n{traceback.format_exc()[-1500:]}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if outcome != "hang" and time.monotonic() - start > HANG_S:
        outcome = "hang"  # stuck in C code, where the alarm could not interrupt it
    if outcome == "hang" and len(EXAMPLES) < 5:
        EXAMPLES.append(f"{family}: ran past {HANG_S} s")
    OUTCOMES[outcome] += 1
    FAMILIES[f"{KIND}/{family}"][outcome] += 1


KIND = ""


# -- checkpoints ---------------------------------------------------------------------------------------------


def _same_tree(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_tree, a, b))
    return bool(a == b) and type(a) is type(b)


def fuzz_checkpoint(cases: int) -> None:
    import torch

    from searchgym.agents.training.checkpoint import load_checkpoint, save_checkpoint
    from searchgym.agents.training.checkpoint_checks import check_config
    from searchgym.agents.training.state import get_rng_state, set_rng_state

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 8)).sum().backward()
    optimizer.step()
    payload = {
        "kind": "grpo",
        "step": 2,
        "model": model.state_dict(),
        "arch": {"kind": "tiny", "layers": 1, "hidden": 4, "tokenizer": None},  # 2 * 4**2 <= 72 weights
        "optimizer": optimizer.state_dict(),
        "rng": get_rng_state(),
        "config": {"lr": 0.1, "seed": 0, "max_turn_tokens": 48, "max_context_tokens": 1024},
    }
    work = Path(tempfile.mkdtemp())
    original = save_checkpoint(work / "original.pt", payload).read_bytes()
    reference = load_checkpoint(work / "original.pt")

    tensors = st.builds(
        lambda dtype, shape: torch.zeros(shape, dtype=dtype),
        st.sampled_from([torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool]),
        st.lists(st.integers(0, 3), max_size=3),
    )
    leaves = JSON | tensors
    config_values = JSON | st.sampled_from(
        [10**5000, 10**12, -1, 0, float("nan"), float("inf"), "abc", 2**63]
    )

    def load(path: Path) -> Any:
        loaded = load_checkpoint(path)
        if "rng" in loaded:
            set_rng_state(loaded["rng"], torch.Generator())
        check_config(loaded.get("config", {}), loaded.get("kind"), path)  # what every loader runs next
        return loaded

    def write(changed: dict[str, Any], path: Path) -> None:
        """Saved back by torch as an editor would (the saved file's format tag and seal kept)."""
        buffer = io.BytesIO()
        torch.save(changed, buffer)
        path.write_bytes(buffer.getvalue())

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        path = work / "case.pt"
        family = data.draw(st.sampled_from(["bytes", "fields", "config"]))
        # An edit of the saved file: its seal kept, unless the mutation drops or replaces it.
        changed = {**reference, "rng": dict(reference["rng"]), "model": dict(reference["model"])}
        if family == "bytes":  # damaged bytes: a typed error, or exactly the saved content
            path.write_bytes(data.draw(byte_mutation(original)))
        elif family == "fields":  # a well-formed file with wrong types, dtypes, shapes or values
            section = data.draw(st.sampled_from(["top", "rng", "model"]))
            target = changed if section == "top" else changed[section]
            key = data.draw(st.sampled_from(sorted(target)))
            if data.draw(st.booleans()):
                del target[key]
            else:
                target[key] = data.draw(leaves)
            write(changed, path)
        else:  # one config field out of type or range (integer bombs, NaN, terabyte contexts)
            key = data.draw(st.sampled_from(sorted(payload["config"])))
            changed["config"] = {**reference["config"], key: data.draw(config_values)}
            write(changed, path)
        run(family, lambda: load(path), reference, _same_tree)

    check()


# -- BM25 index --------------------------------------------------------------------------------------------------


def fuzz_index(cases: int) -> None:
    from searchgym.data import Passage
    from searchgym.retrieval import BM25Retriever

    passages = [
        Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3} w{i % 7}") for i in range(40)
    ]
    work = Path(tempfile.mkdtemp())
    folder = BM25Retriever(passages).save(work / "original")
    npz, meta = (folder / "bm25.npz").read_bytes(), (folder / "bm25.json").read_text()
    with np.load(folder / "bm25.npz") as f:
        arrays = {k: f[k] for k in f.files}
    queries = ["alpha beta", "gamma 3 w2", "title 7", "nothing here", "delta delta 1"]

    def answers(case_dir: Path) -> list[list[tuple[str, float]]]:
        retriever = BM25Retriever.load(case_dir, passages)
        return [[(h.passage_id, round(h.score, 6)) for h in hits] for hits in retriever.search(queries, 3)]

    reference = answers(folder)

    def reseal(case_dir: Path) -> bool:
        from searchgym.integrity import seal

        record = json.loads((case_dir / "bm25.json").read_text())
        try:
            sealed = seal(record, {"bm25.npz": case_dir / "bm25.npz"})
        except ValueError:  # a NaN drawn into the record has no canonical hash: it stays unsealed
            return False
        (case_dir / "bm25.json").write_text(json.dumps(sealed))
        return True

    dtypes = [np.int8, np.int16, np.int32, np.int64, np.uint32, np.uint64, np.float32, np.float64, np.bool_]

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        case_dir = Path(tempfile.mkdtemp(dir=work))
        (case_dir / "bm25.npz").write_bytes(npz)
        (case_dir / "bm25.json").write_text(meta)
        family = data.draw(
            st.sampled_from(["npz bytes", "json bytes", "array", "meta field", "integer bomb"])
        )
        if family == "npz bytes":
            (case_dir / "bm25.npz").write_bytes(data.draw(byte_mutation(npz)))
        elif family == "json bytes":
            (case_dir / "bm25.json").write_bytes(data.draw(byte_mutation(meta.encode())))
        elif family == "integer bomb":
            (case_dir / "bm25.json").write_text(data.draw(integer_bomb(meta)))
        elif family == "array":
            name = data.draw(st.sampled_from(sorted(arrays)))
            array = arrays[name].copy()
            change = data.draw(st.sampled_from(["dtype", "shape", "value", "slice"]))
            if change == "dtype":
                array = array.astype(data.draw(st.sampled_from(dtypes)))
            elif change == "shape":
                array = (
                    array.reshape(1, -1)
                    if data.draw(st.booleans())
                    else array[: len(array) // 2 * 2].reshape(-1, 2)
                )
            elif change == "value" and len(array):
                at = data.draw(st.integers(0, len(array) - 1))
                big = data.draw(st.sampled_from([-1, 40, 2**31 - 1, -(2**31), 10**6]))
                array[at] = np.nan if array.dtype.kind == "f" and data.draw(st.booleans()) else big
            else:
                array = array[data.draw(st.integers(0, len(array))) :]
            np.savez(case_dir / "bm25.npz", **{**arrays, name: array})
            if reseal(case_dir):  # as a crafted index would be: the checks behind the hashes run
                family = "array (re-sealed)"
        else:
            record = json.loads(meta)
            key = data.draw(st.sampled_from(sorted(record)))
            record[key] = data.draw(JSON)
            (case_dir / "bm25.json").write_text(json.dumps(record))
            if key not in ("sha256", "files") and reseal(case_dir):
                family = "meta field (re-sealed)"
        run(family, lambda: answers(case_dir), reference)

    check()


# -- dense index -------------------------------------------------------------------------------------------------


def fuzz_dense(cases: int) -> None:
    import shutil

    import faiss

    from searchgym.data import Passage
    from searchgym.integrity import seal
    from searchgym.retrieval.dense import DenseRetriever, build_dense_index, tiny_encoder

    passages = [
        Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3} w{i % 7}") for i in range(120)
    ]
    work = Path(tempfile.mkdtemp())
    encoder = tiny_encoder()
    dirs = {
        kind: build_dense_index(passages, encoder, work / kind, index_type=kind, progress=False)
        for kind in ("flat", "ivf")
    }
    queries = ["alpha beta", "gamma 3 w2", "title 7", "delta delta 1"]

    def answers(folder: Path, corrupt: Callable[[Any], None] | None = None) -> list[list[str]]:
        retriever = DenseRetriever.load(folder, passages, encoder=encoder)
        if corrupt is not None:
            corrupt(retriever)
        return [[h.passage_id for h in hits] for hits in retriever.search(queries, 5)]

    references = {kind: answers(folder) for kind, folder in dirs.items()}
    originals = {
        kind: {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        for kind, folder in dirs.items()
    }

    def bad_ids(data: Any) -> Callable[[Any], None]:
        """Overwrites one id in an IVF list with one past the corpus (what a damaged index.faiss returns)."""
        bad = data.draw(st.sampled_from([len(passages), len(passages) + 1, 10**6, 2**40, -2]))

        def corrupt(retriever: Any) -> None:
            lists = faiss.extract_index_ivf(retriever.index).invlists
            filled = [i for i in range(lists.nlist) if lists.list_size(i)]
            number = filled[data.draw(st.integers(0, len(filled) - 1))]
            ids = faiss.rev_swig_ptr(lists.get_ids(number), lists.list_size(number))
            ids[data.draw(st.integers(0, lists.list_size(number) - 1))] = bad
            retriever.index.nprobe = lists.nlist

        return corrupt

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        kind = data.draw(st.sampled_from(sorted(dirs)))
        case_dir = Path(tempfile.mkdtemp(dir=work))
        for name, content in originals[kind].items():
            (case_dir / name).write_bytes(content)
        manifest = case_dir / "dense.json"
        families = ["embeddings bytes", "faiss bytes", "manifest bytes", "manifest field", "integer bomb"]
        family = data.draw(st.sampled_from(families + (["faiss ids"] if kind == "ivf" else [])))
        corrupt = None
        if family in ("embeddings bytes", "faiss bytes", "manifest bytes"):
            name = {
                "embeddings bytes": "embeddings.npy",
                "faiss bytes": "index.faiss",
                "manifest bytes": "dense.json",
            }[family]
            if (case_dir / name).is_file():
                (case_dir / name).write_bytes(data.draw(byte_mutation(originals[kind][name])))
        elif family == "integer bomb":
            manifest.write_text(data.draw(integer_bomb(originals[kind]["dense.json"].decode())))
        elif family == "faiss ids":
            corrupt = bad_ids(data)
        else:
            record = json.loads(manifest.read_text())
            key = data.draw(st.sampled_from(sorted(record)))
            value = data.draw(JSON | st.sampled_from(["ivf", "hnsw", "flat", {"nlist": 4, "nprobe": 1.5}]))
            record[key] = value
            if data.draw(st.booleans()) and key not in ("sha256", "files"):
                try:
                    files = {n: case_dir / n for n in record.get("files", {}) if (case_dir / n).is_file()}
                    record = seal(record, files)
                    family = "manifest field (re-sealed)"
                except (ValueError, TypeError, AttributeError):
                    pass  # a record seal cannot hash stays unsealed
            manifest.write_text(json.dumps(record))
        run(family, lambda: answers(case_dir, corrupt), references[kind])
        shutil.rmtree(case_dir, ignore_errors=True)

    check()


# -- FlashRAG JSONL, demonstrations, metrics -------------------------------------------------------------------------


def _lines(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _record_mutation(data: Any, records: list[dict[str, Any]]) -> bytes:
    """A well-formed JSONL file where one field of one record has another type or value."""
    records = [dict(r) for r in records]
    record = records[data.draw(st.integers(0, len(records) - 1))]
    key = data.draw(st.sampled_from(sorted(record)))
    if data.draw(st.booleans()):
        del record[key]
    else:
        record[key] = data.draw(JSON)
    return _lines(records)


def _line_mutation(data: Any, records: list[dict[str, Any]]) -> tuple[str, bytes]:
    """A mutation family and the mutated JSONL bytes: damaged bytes, a changed record or an integer bomb."""
    family = data.draw(st.sampled_from(["bytes", "record", "integer bomb"]))
    if family == "bytes":
        return family, data.draw(byte_mutation(_lines(records)))
    if family == "record":
        return family, _record_mutation(data, records)
    lines = _lines(records).decode().splitlines(keepends=True)
    at = data.draw(st.integers(0, len(lines) - 1))
    lines[at] = data.draw(integer_bomb(lines[at]))
    return family, "".join(lines).encode()


def fuzz_jsonl(cases: int) -> None:
    from searchgym.data import load_flashrag

    corpus = [{"id": str(i), "contents": f'"Title {i}"\nText {i} é'} for i in range(5)]
    questions = [
        {
            "id": f"q{i}",
            "question": f"Q{i}?",
            "golden_answers": [f"a{i}"],
            "metadata": {"supporting_passage_ids": [str(i)]},
        }
        for i in range(4)
    ]
    files = {"corpus.jsonl": corpus, "test.jsonl": questions}

    def content(root: Path) -> Any:
        dataset = load_flashrag(root)
        qs = [
            (q.id, q.question, tuple(q.golden_answers), tuple(q.supporting_ids))
            for q in dataset.questions("test")
        ]
        for q in qs:
            assert all(isinstance(x, str) for x in (q[0], q[1], *q[2], *q[3]))
            "".join((q[1], *q[2])).encode("utf-8")
        ps = [(p.id, p.title, p.text) for p in dataset.passages]
        for p in ps:
            "".join(p).encode("utf-8")
        return qs, ps

    def fresh() -> Path:
        root = Path(tempfile.mkdtemp())
        for name, records in files.items():
            (root / name).write_bytes(_lines(records))
        return root

    reference = content(fresh())

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        root = fresh()
        name = data.draw(st.sampled_from(sorted(files)))
        family, mutated = _line_mutation(data, files[name])
        (root / name).write_bytes(mutated)
        run(family, lambda: content(root), reference)

    check()


def fuzz_demos(cases: int) -> None:
    from searchgym.agents.demonstrations import read_demonstrations

    demos = [
        {"question_id": f"q{i}", "tokens": [1, 2, 3], "sources": [1, 2, 3], "reward": 1.0} for i in range(3)
    ]
    fuzz_lines(cases, demos, lambda path: [repr(d) for d in read_demonstrations(path)])


def fuzz_metrics(cases: int) -> None:
    from searchgym.agents.training.metrics import MetricLogger, read_metrics

    records = [{"step": i, "rollout/reward": 0.5, "train/lr": None} for i in range(1, 5)]

    def consume(path: Path) -> Any:
        loaded = read_metrics(path)
        MetricLogger(path.parent, resume_step=3, tensorboard=False).close()
        return loaded

    fuzz_lines(cases, records, consume)


def fuzz_lines(cases: int, records: list[dict[str, Any]], consume: Callable[[Path], Any]) -> None:
    reference_path = Path(tempfile.mkdtemp()) / "metrics.jsonl"
    reference_path.write_bytes(_lines(records))
    reference = consume(reference_path)

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        path = Path(tempfile.mkdtemp()) / "metrics.jsonl"
        family, mutated = _line_mutation(data, records)
        path.write_bytes(mutated)
        run(family, lambda: consume(path), reference)

    check()


# -- Search-R1 parquet ---------------------------------------------------------------------------------------------------


def fuzz_parquet(cases: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from searchgym.data import load_searchr1, searchr1

    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"Question: q{i}?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": [f"a{i}"]}},
            "extra_info": {"split": "test", "index": i},
        }
        for i in range(4)
    ]
    table = pa.Table.from_pylist(rows)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    original = buffer.getvalue()
    corpus = _lines([{"id": "0", "contents": '"T"\nx'}])
    cap = 2_000  # the row cap, lowered here so a bomb of cap + 1 identical rows is cheap to write
    searchr1.MAX_ROWS = cap
    bomb = io.BytesIO()
    pq.write_table(table.take(np.zeros(cap + 1, dtype=np.int64)), bomb)

    def content(path: Path) -> Any:
        return [(q.id, q.question, tuple(q.golden_answers)) for q in load_searchr1(path).questions("test")]

    root = Path(tempfile.mkdtemp())
    (root / "corpus.jsonl").write_bytes(corpus)
    (root / "test.parquet").write_bytes(original)
    reference = content(root / "test.parquet")

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        root = Path(tempfile.mkdtemp())
        (root / "corpus.jsonl").write_bytes(corpus)
        path = root / "test.parquet"
        family = data.draw(st.sampled_from(["bytes", "column", "row bomb"]))
        if family == "bytes":
            path.write_bytes(data.draw(byte_mutation(original)))
        elif family == "row bomb":
            path.write_bytes(bomb.getvalue())
        else:
            changed = [dict(r) for r in rows]
            key = data.draw(st.sampled_from(sorted(changed[0])))
            value = data.draw(JSON)
            for r in changed:  # a parquet column has one type: change it in every row
                r[key] = value
            try:
                out = io.BytesIO()
                pq.write_table(pa.Table.from_pylist(changed), out)
            except (pa.ArrowException, ValueError, TypeError, OverflowError):
                return  # pyarrow cannot even write it
            path.write_bytes(out.getvalue())
        run(family, lambda: content(path), reference)

    check()


# -- retrieval cassettes --------------------------------------------------------------------------------------------


def _json_mutation(data: Any, document: Any) -> tuple[str, bytes]:
    """A mutation family and the mutated JSON text of ``document``: damaged bytes, one value anywhere replaced
    by another JSON value, an integer bomb, or a nesting bomb."""
    text = json.dumps(document)
    family = data.draw(st.sampled_from(["json bytes", "field", "integer bomb", "nesting bomb"]))
    if family == "json bytes":
        return family, data.draw(byte_mutation(text.encode()))
    if family == "integer bomb":
        return family, data.draw(integer_bomb(text)).encode()
    if family == "nesting bomb":
        return family, text.replace("[", "[" * 100_000, 1).encode()
    spots: list[tuple[Any, Any]] = []

    def walk(value: Any) -> None:
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        )
        for key, child in items:
            spots.append((value, key))
            walk(child)

    changed = json.loads(text)
    walk(changed)
    container, key = spots[data.draw(st.integers(0, len(spots) - 1))]
    container[key] = data.draw(JSON)
    return family, json.dumps(changed).encode()


def fuzz_cassette(cases: int) -> None:
    import gzip
    import os

    from searchgym.data import load_dataset
    from searchgym.integrity import content_sha256
    from searchgym.retrieval import BM25Retriever, Cassette

    os.environ["SEARCHGYM_MAX_FILE_MB"] = "1"  # an inflation bomb past the limit stays cheap to write
    passages = load_dataset().passages[:40]
    queries = ["city founded", "river guild", "a person", "works written"]
    root = Path(tempfile.mkdtemp())
    recorder = Cassette(BM25Retriever(passages), root / "c.json.gz", "record")
    recorder.search(queries, 3)
    recorder.save()
    original = (root / "c.json.gz").read_bytes()
    document = json.loads(gzip.decompress(original))

    def answers(path: Path) -> Any:
        replay = Cassette(None, path, "replay")
        return [[(h.passage_id, h.title, h.text, h.raw_contents, h.score) for h in hits]
                for hits in replay.search(queries, 3)]  # fmt: skip

    reference = answers(root / "c.json.gz")

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        path = Path(tempfile.mkdtemp()) / "c.json.gz"
        family = data.draw(st.sampled_from(["gzip bytes", "json", "inflation bomb"]))
        if family == "gzip bytes":
            path.write_bytes(data.draw(byte_mutation(original)))
        elif family == "inflation bomb":
            padded = {**document, "retriever": "x" * (2 << 20)}  # 2 MiB inflated, a few KB on disk
            path.write_bytes(gzip.compress(json.dumps(padded).encode(), compresslevel=1))
        else:
            family, text = _json_mutation(data, document)
            if family == "field" and data.draw(st.booleans()):
                try:
                    edited = json.loads(text)
                    edited["sha256"] = content_sha256({k: v for k, v in edited.items() if k != "sha256"})
                    text, family = json.dumps(edited).encode(), "field (re-sealed)"
                except (ValueError, TypeError, AttributeError):
                    pass  # a document the hash cannot cover stays as it is
            path.write_bytes(gzip.compress(text))
        run(family, lambda: answers(path), reference)

    check()


# -- eval --out partial records and benchmark pair caches ------------------------------------------------------------


def _episode_records(n: int) -> list[dict[str, Any]]:
    return [
        {
            "question_id": f"q{i}", "question": f"Q{i}?", "em": float(i % 2), "subem": float(i % 2),
            "f1": 0.5 * (i % 2), "reward": float(i % 2), "searches": i, "invalid_turns": 0,
            "policy_tokens": 10 + i, "end_reason": "answered", "gold_retrieved": None, "steps": 12 + i,
            "transcript": f"<answer> a{i} </answer> é",
        }
        for i in range(n)
    ]  # fmt: skip


IDENTITY = {
    "agent": "heuristic",
    "agent_sha256": None,
    "env": "SearchQA-v0",
    "env_options": {"topk": 3},
    "seed": 0,
}


def _mutated_run_record(data: Any, record: dict[str, Any]) -> tuple[str, bytes]:
    """The run record's family: damaged bytes, or one field changed (or dropped)."""
    text = json.dumps(record, indent=2) + "\n"
    if data.draw(st.booleans()):
        return "run record bytes", data.draw(byte_mutation(text.encode()))
    changed = dict(record)
    key = data.draw(st.sampled_from(sorted(changed)))
    if data.draw(st.booleans()):
        del changed[key]
    else:
        changed[key] = data.draw(JSON)
    return "run record field", json.dumps(changed).encode()


def fuzz_partial(cases: int) -> None:
    """``eval --resume``'s reading of ``OUT.partial`` (with its digests) and ``OUT.partial.run.json``: a held
    episode must be exactly one the run wrote, in its place; what is not is played again (a prefix is kept)."""
    from searchgym.app.cli.eval import held_episodes
    from searchgym.data.digests import RecordDigests

    records = _episode_records(4)

    def fresh() -> tuple[Path, Path]:
        root = Path(tempfile.mkdtemp())
        partial, record_path = root / "e.jsonl.partial", root / "e.jsonl.partial.run.json"
        record_path.write_text(json.dumps(IDENTITY, indent=2) + "\n")
        partial.write_bytes(b"")
        digests = RecordDigests(partial, IDENTITY)
        digests.restart()
        with partial.open("ab") as f:
            for line in _lines(records).splitlines(keepends=True):
                f.write(line)
                digests.append(line)
        return partial, record_path

    def held(partial: Path, record_path: Path) -> Any:
        kept, _ = held_episodes(partial, record_path, dict(IDENTITY), 4)
        return [r.to_json() for r in kept]

    reference = held(*fresh())
    assert reference == records

    def kept_prefix(
        result: Any, expected: Any
    ) -> bool:  # the rest is played again: the final file is the same
        return bool(result == expected[: len(result)])

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        partial, record_path = fresh()
        target = data.draw(st.sampled_from(["records", "digests", "run record"]))
        if target == "records":
            family, mutated = _line_mutation(data, records)
            partial.write_bytes(mutated)
            if family == "record" and data.draw(st.booleans()):
                RecordDigests(partial, IDENTITY).restart()
                family = "record (re-digested)"
        elif target == "digests":
            digests = Path(str(partial) + ".digests")
            family, mutated = "digests bytes", data.draw(byte_mutation(digests.read_bytes()))
            digests.write_bytes(mutated)
        else:
            family, mutated = _mutated_run_record(data, IDENTITY)
            record_path.write_bytes(mutated)
        run(family, lambda: held(partial, record_path), reference, kept_prefix)

    check()


def fuzz_pairs(cases: int) -> None:
    """``benchmark``'s cached pair files: a cache is entered only when its record's digest vouches for every
    line, in order; otherwise the pair is played again (counted here as a typed refusal)."""
    from searchgym.app.cli.benchmark import RECORDS_DIGEST, _cached_records
    from searchgym.data.digests import chain_digest
    from searchgym.errors import DataFormatError

    records = _episode_records(4)
    identity = {**IDENTITY, "episodes": 4, "data": {"split_sha256": "0" * 64}}

    def fresh() -> tuple[Path, Path]:
        root = Path(tempfile.mkdtemp())
        path, record_path = root / "nq.jsonl", root / "nq.jsonl.run.json"
        path.write_bytes(_lines(records))
        digest = chain_digest(identity, _lines(records).splitlines(keepends=True))
        record_path.write_text(json.dumps({**identity, RECORDS_DIGEST: digest}, indent=2) + "\n")
        return path, record_path

    def cached(path: Path, record_path: Path) -> Any:
        found, why = _cached_records(path, record_path, dict(identity), 4)
        if found is None:
            raise DataFormatError(str(path), None, f"played again: {why}")
        return found

    reference = cached(*fresh())

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        path, record_path = fresh()
        if data.draw(st.booleans()):
            family, mutated = _line_mutation(data, records)
            path.write_bytes(mutated)
            if family == "record" and data.draw(st.booleans()):  # crafted with a fresh digest
                saved = json.loads(record_path.read_text())
                saved[RECORDS_DIGEST] = chain_digest(identity, mutated.splitlines(keepends=True))
                record_path.write_text(json.dumps(saved))
                family = "record (re-digested)"
        else:
            saved = json.loads(record_path.read_text())
            family, mutated = _mutated_run_record(data, saved)
            record_path.write_bytes(mutated)
        run(family, lambda: cached(path, record_path), reference)

    check()


KINDS: dict[str, Callable[[int], None]] = {
    "checkpoint": fuzz_checkpoint,
    "index": fuzz_index,
    "dense": fuzz_dense,
    "jsonl": fuzz_jsonl,
    "parquet": fuzz_parquet,
    "demos": fuzz_demos,
    "metrics": fuzz_metrics,
    "cassette": fuzz_cassette,
    "partial": fuzz_partial,
    "pairs": fuzz_pairs,
}


def summary(kind: str) -> dict[str, Any]:
    """The run's counts: per outcome, per mutation family, and the reasons where silently wrong is allowed."""
    families = {name: dict(counts) for name, counts in sorted(FAMILIES.items())}
    return {
        "kind": kind,
        "cases": sum(OUTCOMES.values()),
        "outcomes": {name: OUTCOMES[name] for name in OUTCOME_NAMES},
        "families": families,
        "no_checksum": {name: NO_CHECKSUM[name] for name in families if name in NO_CHECKSUM},
        "examples": EXAMPLES,
    }


if __name__ == "__main__":
    KIND, cases = sys.argv[1], int(sys.argv[2])
    DERANDOMIZE = "--derandomize" in sys.argv[3:]
    KINDS[KIND](cases)
    print(json.dumps(summary(KIND)))
