"""Fuzzes the file loaders in this process; run by ``test_fuzz_files.py`` in a child process.

``python fuzz_files_worker.py KIND CASES [--derandomize]`` mutates valid files of KIND (``checkpoint``, ``index``,
``jsonl``, ``parquet``, ``demos``, ``metrics``) with hypothesis: truncation, bit flips, overwritten,
inserted and deleted bytes, and changes of types, dtypes, shapes and values. Each case must end in a typed
searchgym error or a correct load (and a loaded index must answer queries). A raw exception fails the run
(hypothesis reports the smallest case); a crash (segfault) shows as the child's signal. The last line of
output is a JSON summary: the kind, the number of cases, and their outcomes.
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.errors import SearchGymError

OUTCOMES: Counter[str] = Counter()
DERANDOMIZE = False


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


def run(case: Callable[[], Any]) -> None:
    """Runs one case; records a typed error or a load; anything else propagates (and fails the run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            case()
        except SearchGymError as e:
            OUTCOMES[f"error:{type(e).__name__}"] += 1
            return
    OUTCOMES["loaded"] += 1


# -- checkpoints ---------------------------------------------------------------------------------------------


def fuzz_checkpoint(cases: int) -> None:
    import torch

    from searchgym.agents.grpo.checkpoint import (
        get_rng_state,
        load_checkpoint,
        save_checkpoint,
        set_rng_state,
    )

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
        "config": {"lr": 0.1, "seed": 0},
    }
    work = Path(tempfile.mkdtemp())
    original = save_checkpoint(work / "original.pt", payload).read_bytes()
    reference = load_checkpoint(work / "original.pt")

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list | tuple):
            return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
        return bool(a == b) and type(a) is type(b)

    tensors = st.builds(
        lambda dtype, shape: torch.zeros(shape, dtype=dtype),
        st.sampled_from([torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool]),
        st.lists(st.integers(0, 3), max_size=3),
    )
    leaves = JSON | tensors

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        path = work / "case.pt"
        if data.draw(st.booleans()):  # damaged bytes: a typed error, or exactly the saved content
            path.write_bytes(data.draw(byte_mutation(original)))

            def case() -> None:
                loaded = load_checkpoint(path)
                assert same(loaded, reference), "a damaged checkpoint loaded with different content"

        else:  # a well-formed file with wrong types, dtypes, shapes or values
            changed = {**payload, "rng": dict(payload["rng"]), "model": dict(payload["model"])}
            section = data.draw(st.sampled_from(["top", "rng", "model"]))
            target = changed if section == "top" else changed[section]
            key = data.draw(st.sampled_from(sorted(target)))
            if data.draw(st.booleans()):
                del target[key]
            else:
                target[key] = data.draw(leaves)
            buffer = io.BytesIO()
            torch.save({"format": "searchgym-checkpoint-v2", **changed}, buffer)
            path.write_bytes(buffer.getvalue())

            def case() -> None:
                loaded = load_checkpoint(path)
                if "rng" in loaded:
                    set_rng_state(loaded["rng"], torch.Generator())

        run(case)

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

    def reseal(case_dir: Path) -> None:
        from searchgym.integrity import seal

        record = json.loads((case_dir / "bm25.json").read_text())
        try:
            sealed = seal(record, {"bm25.npz": case_dir / "bm25.npz"})
        except ValueError:  # a NaN drawn into the record has no canonical hash: it stays unsealed
            return
        (case_dir / "bm25.json").write_text(json.dumps(sealed))

    dtypes = [np.int8, np.int16, np.int32, np.int64, np.uint32, np.uint64, np.float32, np.float64, np.bool_]

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        case_dir = Path(tempfile.mkdtemp(dir=work))
        (case_dir / "bm25.npz").write_bytes(npz)
        (case_dir / "bm25.json").write_text(meta)
        what = data.draw(st.sampled_from(["npz bytes", "json bytes", "array", "meta field"]))
        if what == "npz bytes":
            (case_dir / "bm25.npz").write_bytes(data.draw(byte_mutation(npz)))
        elif what == "json bytes":
            (case_dir / "bm25.json").write_bytes(data.draw(byte_mutation(meta.encode())))
        elif what == "array":
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
            reseal(case_dir)  # as a crafted index would be: the checks behind the hashes run
        else:
            record = json.loads(meta)
            key = data.draw(st.sampled_from(sorted(record)))
            record[key] = data.draw(JSON)
            (case_dir / "bm25.json").write_text(json.dumps(record))
            if key not in ("sha256", "files"):
                reseal(case_dir)

        def case() -> None:
            retriever = BM25Retriever.load(case_dir, passages)
            for hits in retriever.search(queries, 3):
                assert len(hits) <= 3 and all(h.passage_id in {p.id for p in passages} for h in hits)

        run(case)

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

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        root = Path(tempfile.mkdtemp())
        for name, records in files.items():
            (root / name).write_bytes(_lines(records))
        name = data.draw(st.sampled_from(sorted(files)))
        if data.draw(st.booleans()):
            (root / name).write_bytes(data.draw(byte_mutation(_lines(files[name]))))
        else:
            (root / name).write_bytes(_record_mutation(data, files[name]))

        def case() -> None:
            dataset = load_flashrag(root)
            for q in dataset.questions("test"):
                assert all(
                    isinstance(x, str) for x in (q.id, q.question, *q.golden_answers, *q.supporting_ids)
                )
                (q.question + "".join(q.golden_answers)).encode("utf-8")
            for p in dataset.passages:
                (p.id + p.title + p.text).encode("utf-8")

        run(case)

    check()


def fuzz_demos(cases: int) -> None:
    from searchgym.agents.demonstrations import read_demonstrations

    demos = [
        {"question_id": f"q{i}", "tokens": [1, 2, 3], "sources": [1, 2, 3], "reward": 1.0} for i in range(3)
    ]
    fuzz_lines(cases, demos, lambda path: read_demonstrations(path))


def fuzz_metrics(cases: int) -> None:
    from searchgym.agents.grpo.runtime import MetricLogger, read_metrics

    records = [{"step": i, "rollout/reward": 0.5, "train/lr": None} for i in range(1, 5)]

    def consume(path: Path) -> None:
        read_metrics(path)
        MetricLogger(path.parent, resume_step=3, tensorboard=False).close()

    fuzz_lines(cases, records, consume)


def fuzz_lines(cases: int, records: list[dict[str, Any]], consume: Callable[[Path], Any]) -> None:
    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        path = Path(tempfile.mkdtemp()) / "metrics.jsonl"
        if data.draw(st.booleans()):
            path.write_bytes(data.draw(byte_mutation(_lines(records))))
        else:
            path.write_bytes(_record_mutation(data, records))
        run(lambda: consume(path))

    check()


# -- Search-R1 parquet ---------------------------------------------------------------------------------------------------


def fuzz_parquet(cases: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from searchgym.data import load_searchr1

    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"Question: q{i}?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": [f"a{i}"]}},
            "extra_info": {"split": "test", "index": i},
        }
        for i in range(4)
    ]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    original = buffer.getvalue()
    corpus = _lines([{"id": "0", "contents": '"T"\nx'}])

    @case_settings(cases)
    @given(st.data())
    def check(data: Any) -> None:
        root = Path(tempfile.mkdtemp())
        (root / "corpus.jsonl").write_bytes(corpus)
        path = root / "test.parquet"
        if data.draw(st.booleans()):
            path.write_bytes(data.draw(byte_mutation(original)))
        else:
            changed = [dict(r) for r in rows]
            key = data.draw(st.sampled_from(sorted(changed[0])))
            value = data.draw(JSON)
            for r in changed:  # a parquet column has one type: change it in every row
                r[key] = value
            try:
                table = pa.Table.from_pylist(changed)
                out = io.BytesIO()
                pq.write_table(table, out)
            except (pa.ArrowException, ValueError, TypeError, OverflowError):
                return  # pyarrow cannot even write it
            path.write_bytes(out.getvalue())
        run(lambda: load_searchr1(path).questions("test"))

    check()


KINDS: dict[str, Callable[[int], None]] = {
    "checkpoint": fuzz_checkpoint,
    "index": fuzz_index,
    "jsonl": fuzz_jsonl,
    "parquet": fuzz_parquet,
    "demos": fuzz_demos,
    "metrics": fuzz_metrics,
}


if __name__ == "__main__":
    kind, cases = sys.argv[1], int(sys.argv[2])
    DERANDOMIZE = "--derandomize" in sys.argv[3:]
    KINDS[kind](cases)
    print(json.dumps({"kind": kind, "cases": sum(OUTCOMES.values()), "outcomes": dict(OUTCOMES)}))
