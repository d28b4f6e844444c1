"""``searchgym/server/wire.py``: the limits a request is held to, and the bounded JSON parser under
``parse_request``, which equals ``json.loads`` within its value budget."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from searchgym.errors import ConfigError
from searchgym.server import RequestError, ServerLimits, loads_bounded, parse_request


def test_limits_are_validated() -> None:
    with pytest.raises(ConfigError):
        ServerLimits(topk_max=0)
    with pytest.raises(ConfigError):
        ServerLimits(default_topk=5, topk_max=4)


def test_timeouts_and_connection_limits_are_validated() -> None:
    for bad in (
        {"read_timeout": 0},
        {"write_timeout": float("nan")},
        {"read_timeout": True},
        {"max_connections": 0},
    ):
        with pytest.raises(ConfigError):
            ServerLimits(**bad)


# -- the bounded parser ----------------------------------------------------------------------------------------

LOADS_TABLE: list[bytes] = [
    b'{"queries": ["a", "b"], "topk": 3, "return_scores": true}',
    b' \t\r\n{ "queries" : [ ] , "x" : { "y" : [1, -2.5e3, null, false, "\\u00e9\\n\\"q\\""] } }\n ',
    b'{"a": 1, "a": 2}',  # the last of a repeated key wins, as json.loads
    b'{"n": [NaN, Infinity, -Infinity, 0, 1E2], "deep": [[[[{}]]]], "e": {}}',
    '{"q": ["caf\u00e9", "\u4e2d\u6587"]}'.encode(),
    '{"q": ["caf\u00e9"]}'.encode("utf-16"),  # json.loads detects UTF-16 and UTF-32
    b'\xef\xbb\xbf{"bom": true}',
    b'["a list"]',
    b'"a string"',
]

BAD_JSON: list[bytes] = [
    b"",
    b"{",
    b'{"a" 1}',
    b'{"a": 1,}',
    b"[1 2]",
    b"[1,]",
    b"{'a': 1}",
    b'{"a": 1} x',
    b'{"a": "\x01"}',  # a control character in a string
    b'{"a": "\\x"}',
    b"\xff\xfe\xfd",
    b'{"big": ' + b"9" * 5000 + b"}",  # over Python's 4,300-digit integer limit
    b"[" * 65 + b"]" * 65,  # deeper than 64 levels
]


@pytest.mark.parametrize("body", LOADS_TABLE, ids=range(len(LOADS_TABLE)))
def test_loads_bounded_equals_json_loads(body: bytes) -> None:
    assert loads_bounded(body, 100) == json.loads(body)


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 6)
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return {rng.choice(["a", "b", "queries", "é", ""]): random_json(rng, depth + 1) for _ in range(3)}
    return [None, True, False, rng.randint(-(10**20), 10**20), rng.uniform(-1e9, 1e9), 'q"\\\n\u2603'][kind]


def test_loads_bounded_equals_json_loads_on_random_documents() -> None:
    rng = random.Random(0)
    for _ in range(300):
        doc = random_json(rng)
        text = json.dumps(doc, indent=rng.choice([None, 0, 2]), ensure_ascii=rng.random() < 0.5)
        assert loads_bounded(text.encode(), 10_000) == json.loads(text)


@pytest.mark.parametrize("body", BAD_JSON, ids=range(len(BAD_JSON)))
def test_loads_bounded_refuses_what_is_not_json(body: bytes) -> None:
    with pytest.raises(RequestError) as info:
        loads_bounded(body, 100)
    assert info.value.status == 400


def test_loads_bounded_stops_at_the_value_budget() -> None:
    assert loads_bounded(b'{"queries": ["a", "b"]}', 4) == {"queries": ["a", "b"]}  # containers count
    for body in (b'{"queries": ["a", "b", "c"]}', b'{"x": [[], []], "queries": []}'):
        with pytest.raises(RequestError) as info:
            loads_bounded(body, 4)
        assert info.value.status == 413
    # 16 MiB of empty lists: json.loads would build 5.6 million lists, holding the GIL ~5 s.
    body = b'{"queries": [' + b"[]," * (16 * 2**20 // 3 - 10) + b"[]]}"
    start = time.perf_counter()
    with pytest.raises(RequestError, match="more than 5120 JSON values"):
        parse_request(body, ServerLimits())
    assert time.perf_counter() - start < 2.0
