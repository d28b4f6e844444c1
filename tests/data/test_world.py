import hashlib
import json
import os
import subprocess
import sys

from searchgym.data import WORLD_VERSION, generate_world
from searchgym.retrieval import analyze

_DIGEST_SCRIPT = """
import hashlib, json
from searchgym.data import generate_world
w = generate_world(seed=7)
blob = json.dumps([[p.id, p.title, p.text] for p in w.passages]
                  + [[s, q.id, q.question, q.golden_answers, q.supporting_ids, q.kind]
                     for s, qs in sorted(w.splits.items()) for q in qs])
print(hashlib.sha256(blob.encode()).hexdigest())
"""


def test_same_seed_same_world_across_processes() -> None:
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd="/",
        )
        digests.add(out.stdout.strip())
    assert len(digests) == 1
    w = generate_world(seed=7)
    blob = json.dumps(
        [[p.id, p.title, p.text] for p in w.passages]
        + [
            [s, q.id, q.question, q.golden_answers, q.supporting_ids, q.kind]
            for s, qs in sorted(w.splits.items())
            for q in qs
        ]
    )
    assert hashlib.sha256(blob.encode()).hexdigest() in digests


def test_different_seeds_differ() -> None:
    assert generate_world(seed=0).passages != generate_world(seed=1).passages


def test_world_shape() -> None:
    w = generate_world()
    assert w.name == f"world-v{WORLD_VERSION}-seed0"
    kinds = {p.id.rstrip("0123456789") for p in w.passages}
    assert kinds == {"person", "city", "org", "work"}
    assert len({p.title for p in w.passages}) == len(w.passages)  # titles are unique
    by_split = {s: {q.question for q in qs} for s, qs in w.splits.items()}
    assert set(by_split) == {"train", "validation", "test"}
    assert not by_split["train"] & by_split["test"]
    assert not by_split["train"] & by_split["validation"]
    assert not by_split["validation"] & by_split["test"]
    test = w.splits["test"]
    assert {q.kind for q in test} == {"attribute", "bridge", "comparison"}
    assert {q.hops for q in test} == {1, 2}


def test_questions_are_answerable_from_their_supporting_passages() -> None:
    w = generate_world()
    for q in w.splits["test"]:
        support = [w.passage_index[pid] for pid in q.supporting_ids]
        assert support, q
        text = " ".join(f"{p.title} {p.text}" for p in support)
        # The answer (or, for comparisons, the named entity) appears in the evidence.
        assert any(a in text for a in q.golden_answers), q


def test_distractors_exist() -> None:
    w = generate_world()
    surnames = [p.title.split()[-1] for p in w.passages if p.id.startswith("person")]
    assert len(set(surnames)) < len(surnames) * 0.6  # families share surnames
    titles = sorted(p.title for p in w.passages if p.id.startswith("person"))
    one_letter_apart = sum(
        1
        for a in titles
        for b in titles
        if a < b and len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1
    )
    assert one_letter_apart >= 10
    tokens = {t for p in w.passages for t in analyze(p.title)}
    assert "the" in tokens or len(tokens) > 100
