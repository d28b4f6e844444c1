"""``searchgym view``: the page's data (turns, queries, passages, gold marks, filters' values, both record
formats, malformed lines, escaping), the per-token log-probs it colours by, and the page in a real browser."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.cli import main
from searchgym.app.view.html import embed_json, render_page
from searchgym.app.view.page import outcome, page_episodes, read_episodes, split_transcript_text
from searchgym.data import load_dataset
from searchgym.errors import DataFormatError
from searchgym.protocol import format_prompt
from searchgym.tokenization import load_tokenizer

SCRIPT_BREAKER = '</script><script>document.title="broken"</script><!-- x'


def page_data(html: Path) -> dict[str, Any]:
    """The JSON the page embeds."""
    text = html.read_text(encoding="utf-8")
    block = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', text, re.DOTALL)
    assert block is not None
    return json.loads(block.group(1))


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 heuristic episodes on the generated world's test split (correct and wrong answers, one search each)."""
    out = tmp_path_factory.mktemp("eval") / "heuristic.jsonl"
    argv = ["eval", "--agent", "heuristic", "--episodes", "20", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def oracle_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The oracle on the same 20 questions as :func:`eval_file` (every answer right)."""
    out = tmp_path_factory.mktemp("eval") / "oracle.jsonl"
    argv = ["eval", "--agent", "oracle", "--episodes", "20", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def records(eval_file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in eval_file.read_text().splitlines()]


def transcript(question: str, turns: list[tuple[str, str | None]]) -> str:
    text = f"[prompt]{format_prompt(question)}[/prompt]"
    for policy, tool in turns:
        text += f"[policy]{policy}[/policy]"
        if tool is not None:
            text += f"[tool]{tool}[/tool]"
    return text


def eval_record(**fields: Any) -> dict[str, Any]:
    base = {
        "question_id": "q",
        "question": "Who?",
        "golden_answers": ["Ann"],
        "queries": [],
        "retrieved_ids": [],
        "answer": None,
        "em": 0.0,
        "f1": 0.0,
        "searches": 0,
        "end_reason": "turn_budget",
        "reward": 0.0,
        "transcript": transcript("Who?", [("hmm", "\nMy previous action is invalid.\n")]),
    }
    return {**base, **fields}


# -- turns, queries and passages ---------------------------------------------------------------------------


def test_transcript_segments_split_where_the_next_segment_starts() -> None:
    text = (
        "[prompt]P[/prompt][policy]a [/policy] b[/policy][tool]T[/tool][policy]<answer> x </answer>[/policy]"
    )
    assert [(s.source, s.text) for s in split_transcript_text(text)] == [
        ("prompt", "P"),
        ("policy", "a [/policy] b"),
        ("tool", "T"),
        ("policy", "<answer> x </answer>"),
    ]
    with pytest.raises(ValueError, match="not \\[prompt\\]/\\[policy\\]/\\[tool\\] segments"):
        split_transcript_text("[prompt]P[/prompt] stray")


def test_eval_turns_hold_the_policy_text_query_and_passages_of_each_search(
    eval_file: Path, records: list[dict[str, Any]]
) -> None:
    from searchgym.agents.heuristic import parse_information

    pages = page_episodes(read_episodes([eval_file]))
    assert len(pages) == len(records) == 20
    for page, record in zip(pages, records, strict=True):
        segments = split_transcript_text(record["transcript"])
        policy = [s.text for s in segments if s.source == "policy"]
        tools = [s.text for s in segments if s.source == "tool"]
        assert [t["text"] for t in page["turns"]] == policy
        assert page["prompt"] == segments[0].text
        searches = [t for t in page["turns"] if t["kind"] == "search"]
        assert [t["query"] for t in searches] == record["queries"]
        for turn, ids, tool in zip(searches, record["retrieved_ids"], tools, strict=False):
            shown = parse_information(tool)
            assert [p["id"] for p in turn["passages"]] == ids
            assert [(p["title"], p["text"]) for p in turn["passages"]] == shown
            assert all(p["gold"] is None for p in turn["passages"])  # no dataset, no supporting ids
        assert page["turns"][-1]["kind"] == "answer" and page["turns"][-1]["answer"] == record["answer"]
        assert page["outcome"] == ("correct" if record["em"] else "wrong")
        assert (page["em"], page["f1"], page["reward"]) == (record["em"], record["f1"], record["reward"])
        assert page["dataset"] == "heuristic.jsonl" and page["gold_ids"] is None


def test_with_the_dataset_passages_are_whole_and_gold_ones_marked(eval_file: Path) -> None:
    world = load_dataset("world")
    pages = page_episodes(read_episodes([eval_file]), dataset=world)
    questions = {q.id: q for q in world.questions("test")}
    marked = 0
    for page in pages:
        support = set(questions[page["question_id"]].supporting_ids)
        assert page["gold_ids"] == list(questions[page["question_id"]].supporting_ids)
        for turn in page["turns"]:
            for p in turn["passages"]:
                passage = world.passage_index[p["id"]]
                assert (p["title"], p["text"]) == (passage.title, passage.text)
                assert p["gold"] is (p["id"] in support)
                marked += p["gold"]
    assert marked > 0


def test_a_flashrag_folder_marks_supporting_and_gold_passage_ids(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    corpus = [
        ("0", "Varnholt", "Varnholt was founded by Mira Oslo in 1820."),
        ("1", "Mira Oslo", "Mira Oslo was a Danish engineer."),
        ("2", "Kettle Lake", "Kettle Lake lies north of Varnholt."),
        ("3", "Brass Works", "The Brass Works closed in 1990."),
    ]
    write_jsonl(folder / "corpus.jsonl", [{"id": i, "contents": f'"{t}"\n{x}'} for i, t, x in corpus])
    questions = [
        {
            "id": "a",
            "question": "Who founded Varnholt?",
            "golden_answers": ["Mira Oslo"],
            "metadata": {"supporting_passage_ids": ["0"]},
        },
        {
            "id": "b",
            "question": "When did the Brass Works close?",
            "golden_answers": ["1990"],
            "metadata": {"gold_passage_ids": ["3"]},
        },
    ]
    write_jsonl(folder / "test.jsonl", questions)
    out = tmp_path / "oracle.jsonl"
    argv = ["eval", "--agent", "oracle", "--dataset", str(folder), "--episodes", "2", "--topk", "2"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    pages = page_episodes(read_episodes([out]), dataset=load_dataset(str(folder)))
    gold = {
        p["question_id"]: [x["id"] for t in p["turns"] for x in t["passages"] if x["gold"]] for p in pages
    }
    assert gold == {"a": ["0"], "b": ["3"]}
    assert all(
        x["gold"] is False for p in pages for t in p["turns"] for x in t["passages"] if x["id"] not in "03"
    )


def test_a_record_s_own_supporting_ids_mark_gold_without_a_dataset(
    records: list[dict[str, Any]], tmp_path: Path
) -> None:
    record = next(r for r in records if r["retrieved_ids"] and len(r["retrieved_ids"][0]) > 1)
    first, second = record["retrieved_ids"][0][:2]
    path = write_jsonl(tmp_path / "r.jsonl", [{**record, "supporting_ids": [second]}])
    (page,) = page_episodes(read_episodes([path]))
    marks = {p["id"]: p["gold"] for p in page["turns"][0]["passages"]}
    assert marks[first] is False and marks[second] is True and page["gold_ids"] == [second]


def test_episodes_of_another_dataset_are_left_unmarked_with_a_warning(
    eval_file: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "other"
    folder.mkdir()
    write_jsonl(folder / "corpus.jsonl", [{"id": "0", "contents": '"A"\ntext'}])
    write_jsonl(
        folder / "test.jsonl", [{"id": "test-0", "question": "Another question?", "golden_answers": ["x"]}]
    )
    warnings: list[str] = []
    pages = page_episodes(read_episodes([eval_file]), dataset=load_dataset(str(folder)), warn=warnings.append)
    assert all(p["gold"] is None for page in pages for t in page["turns"] for p in t["passages"])
    assert len(warnings) == 1 and warnings[0].startswith("20 of 20 episodes have no question")


# -- filters' values -------------------------------------------------------------------------------------


def test_outcomes_are_correct_wrong_or_no_answer(tmp_path: Path) -> None:
    assert (outcome(None, 0.0), outcome("", 0.0), outcome("Ann", 1.0)) == ("no_answer", "wrong", "correct")
    answered = transcript("Who?", [("<answer> Ann </answer>", None)])
    rows = [
        eval_record(),
        eval_record(answer="Bob", end_reason="answered", transcript=answered.replace("Ann", "Bob")),
        eval_record(answer="Ann", em=1.0, f1=1.0, reward=1.0, end_reason="answered", transcript=answered),
        eval_record(answer="", end_reason="answered", transcript=answered.replace(" Ann ", "")),
    ]
    pages = page_episodes(read_episodes([write_jsonl(tmp_path / "o.jsonl", rows)]))
    assert [p["outcome"] for p in pages] == ["no_answer", "wrong", "correct", "wrong"]
    assert [t["kind"] for t in pages[0]["turns"]] == ["invalid"]
    assert pages[0]["turns"][0]["tool"] == "\nMy previous action is invalid.\n"


def test_several_files_are_datasets_unless_records_name_theirs(
    records: list[dict[str, Any]], tmp_path: Path
) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", records[:3])
    b = write_jsonl(tmp_path / "b.jsonl", [{**r, "dataset": "hotpot"} for r in records[3:5]] + records[5:6])
    (tmp_path / "sub").mkdir()
    c = write_jsonl(tmp_path / "sub" / "a.jsonl", records[6:7])
    pages = page_episodes(read_episodes([a, b, c]))
    # Two files named a.jsonl: each is labelled by its path.
    assert [p["dataset"] for p in pages] == [str(a)] * 3 + ["hotpot", "hotpot", "b.jsonl", str(c)]
    assert [p["source"] for p in pages][3:6] == [f"{b}:1", f"{b}:2", f"{b}:3"]


# -- export-trajectories rows --------------------------------------------------------------------------------


def export_row(fmt: str, *, answer: str = "Ann") -> dict[str, Any]:
    """A hand-made export row over the built-in tokenizer: a search, its results, an answer."""
    tok = load_tokenizer(None)
    info = '\n\n<information>Doc 1(Title: "Kettle Lake") Kettle Lake lies north.\nDoc 2(Title: "Ann") Ann is.</information>\n\n'
    parts = [
        (format_prompt("Who?"), None),
        ("<search> kettle </search>", 1),
        (info, 0),
        (f"<answer> {answer} </answer>", 1),
    ]
    prompt = tok.encode(parts[0][0])
    response, mask = [], []
    for text, m in parts[1:]:
        ids = tok.encode(text)
        response += ids
        mask += [m] * len(ids)
    logprobs = [-0.5 - 0.01 * i if m else 0.0 for i, m in enumerate(mask)]
    fields = {"question_id": "q", "question": "Who?", "golden_answers": ["Ann"], "answer": answer}
    fields |= {
        "em": float(answer == "Ann"),
        "f1": float(answer == "Ann"),
        "searches": 1,
        "end_reason": "answered",
    }
    if fmt == "trl":
        trl = {"completion_ids": response, "env_mask": mask, "logprobs": logprobs, "reward": fields["em"]}
        return {"prompt_ids": prompt, **trl, **fields}
    verl = {"response_ids": response, "response_mask": mask, "response_logprobs": logprobs}
    extra = {"reward_score": fields["em"], "num_turns": 4, "metrics": {}, "extra_fields": fields}
    return {"prompt_ids": prompt, **verl, **extra}


@pytest.mark.parametrize("fmt", ["trl", "verl"])
def test_export_rows_are_decoded_into_the_same_turns(fmt: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / f"{fmt}.jsonl", [export_row(fmt), export_row(fmt, answer="Bob")])
    episodes = read_episodes([path])
    pages = page_episodes(episodes)
    assert [p["outcome"] for p in pages] == ["correct", "wrong"] and pages[0]["reward"] == 1.0
    turns = pages[0]["turns"]
    assert [(t["kind"], t["query"], t["answer"]) for t in turns] == [
        ("search", "kettle", None),
        ("answer", None, "Ann"),
    ]
    assert [(p["rank"], p["id"], p["title"], p["gold"]) for p in turns[0]["passages"]] == [
        (1, None, "Kettle Lake", None),
        (2, None, "Ann", None),
    ]
    assert pages[0]["prompt"] == format_prompt("Who?") and pages[0]["searches"] == 1
    policy = [s for s in episodes[0].segments if s.source == "policy"]
    assert policy[0].logprobs is not None and policy[0].logprobs[0] == -0.5


def test_export_row_passages_are_named_from_the_dataset_by_title_and_text(tmp_path: Path) -> None:
    world = load_dataset("world")
    question = next(q for q in world.questions("train") if q.supporting_ids)
    gold = world.passage_index[question.supporting_ids[0]]
    other = next(p for p in world.passages if p.id not in question.supporting_ids)
    tok = load_tokenizer(None)
    row = export_row("trl")
    info = (
        f'\n\n<information>Doc 1(Title: "{other.title}") {other.text}\nDoc 2(Title: "{gold.title}") '
        + " ".join(gold.text.split()[:4])
        + "</information>\n\n"
    )
    search, tool, answer = (
        tok.encode("<search> x </search>"),
        tok.encode(info),
        tok.encode("<answer> y </answer>"),
    )
    row |= {
        "question_id": question.id,
        "question": question.question,
        "completion_ids": search + tool + answer,
    }
    row |= {"env_mask": [1] * len(search) + [0] * len(tool) + [1] * len(answer), "logprobs": None}
    (page,) = page_episodes(read_episodes([write_jsonl(tmp_path / "t.jsonl", [row])]), dataset=world)
    passages = page["turns"][0]["passages"]
    assert [(p["id"], p["text"], p["gold"]) for p in passages] == [
        (other.id, other.text, False),
        (gold.id, gold.text, True),  # shown cut to 4 words, named and shown whole
    ]


@pytest.mark.slow
def test_the_real_export_trajectories_files_are_read(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    for fmt in ("trl", "verl"):
        out = tmp_path / f"{fmt}.jsonl"
        argv = ["export-trajectories", "--out", str(out), "--format", fmt, "--episodes", "2", "--batch", "2"]
        assert main([*argv, "--max-turns", "2", "--max-turn-tokens", "8"]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        pages = page_episodes(read_episodes([out]))
        tok = load_tokenizer(None)
        for page, row in zip(pages, rows, strict=True):
            response = row.get("completion_ids", row.get("response_ids"))
            mask = row.get("env_mask", row.get("response_mask"))
            policy = tok.decode([i for i, m in zip(response, mask, strict=True) if m])
            assert "".join(t["text"] for t in page["turns"]) == policy
            assert page["prompt"] == tok.decode(row["prompt_ids"])
            assert page["question_id"] == (row.get("extra_fields") or row)["question_id"]


# -- malformed input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"question": "x"}', "neither an eval record"),
        ('{"transcript": 3}', "field 'transcript' must be str"),
        (
            '{"transcript": "[prompt]P[/prompt]", "golden_answers": "Ann"}',
            "field 'golden_answers' must be list",
        ),
        (
            '{"transcript": "[prompt]P[/prompt]", "supporting_ids": [1.5]}',
            "supporting_ids must hold passage ids",
        ),
        ('{"transcript": "no segments"}', "not [prompt]/[policy]/[tool] segments"),
        (
            '{"transcript": "[prompt]P[/prompt]", "retrieved_ids": [3]}',
            "'retrieved_ids' must be a list of lists",
        ),
        (
            '{"prompt_ids": [1], "completion_ids": [2, 3], "env_mask": [1]}',
            "'env_mask' must be 2 zeros and ones",
        ),
        (
            '{"prompt_ids": [1], "completion_ids": [99999], "env_mask": [1]}',
            "token id 99999 in 'completion_ids'",
        ),
        (
            '{"prompt_ids": [1], "response_ids": ["a"], "response_mask": [1]}',
            "'response_ids' must be a list of token",
        ),
    ],
)
def test_a_malformed_line_names_the_file_and_line(
    line: str, message: str, records: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(records[0]) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as caught:
        read_episodes([path])
    assert str(caught.value).startswith(f"{path}:3: ") and message in str(caught.value)
    assert caught.value.line == 3


def test_the_cli_reports_a_malformed_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("[1, 2]\n", encoding="utf-8")
    assert main(["view", str(path)]) == 2
    assert f"{path}:1: expected a JSON object" in capsys.readouterr().err
    assert not (tmp_path / "bad.html").exists()


# -- the page ----------------------------------------------------------------------------------------------


def test_script_end_tags_in_the_data_cannot_end_the_data_element(
    records: list[dict[str, Any]], tmp_path: Path
) -> None:
    record = dict(records[0])
    record["transcript"] = record["transcript"].replace(") ", f") {SCRIPT_BREAKER} ", 1)
    record["question"] = "Is 1 < 2 & 3 > 2?\u2028"
    path = write_jsonl(tmp_path / "x.jsonl", [record])
    pages = page_episodes(read_episodes([path]))
    assert SCRIPT_BREAKER in pages[0]["turns"][0]["passages"][0]["text"]
    html = render_page(pages, {"title": "t", "files": ["x.jsonl"], "colour": None})
    data = html.split('id="page-data">', 1)[1]
    block, rest = data.split("</script>", 1)
    assert "<" not in block and ">" not in block and "&" not in block and "\u2028" not in block
    assert json.loads(block)["episodes"] == json.loads(json.dumps(pages))
    assert rest.lstrip().startswith("<script>")  # the page's own script follows, intact
    assert json.loads(embed_json({"a": "</script>"})) == {"a": "</script>"}


def test_the_cli_writes_the_page_beside_the_records_and_prints_its_path(
    eval_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tmp_path / "runs" / "first.jsonl"
    first.parent.mkdir()
    shutil.copy(eval_file, first)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["view", str(first), str(eval_file)]) == 0
    out = first.parent / "first.html"
    assert capsys.readouterr().out.strip() == str(out)
    assert out.is_file() and not list(here.iterdir())  # nothing lands in the working folder
    assert not (first.parent / "first.html.partial").exists()
    data = page_data(out)
    assert len(data["episodes"]) == 40 and data["meta"]["files"] == ["first.jsonl", "heuristic.jsonl"]
    assert data["meta"]["title"] is None  # the header names the files once, not again in a title
    # The eval's manifest names its agent and dataset; the copy without one is known by its name.
    assert {(e["agent"], e["dataset"]) for e in data["episodes"]} == {
        ("", "first.jsonl"),
        ("heuristic", "world"),
    }
    page = tmp_path / "p" / "page.html"
    assert main(["view", str(first), "--out", str(page), "--dataset", "world"]) == 0
    assert any(p["gold"] for e in page_data(page)["episodes"] for t in e["turns"] for p in t["passages"])
    assert main(["view", str(first), "--out", str(first)]) == 2
    assert main(["view", str(first), "--against", "x.pt"]) == 2
    assert "give --checkpoint too" in capsys.readouterr().err


def test_two_agents_episodes_of_one_question_are_peers(
    eval_file: Path, oracle_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "two.html"
    assert main(["view", str(eval_file), str(oracle_file), "--out", str(out)]) == 0
    episodes = page_data(out)["episodes"]
    assert [e["agent"] for e in episodes] == ["heuristic"] * 20 + ["oracle"] * 20
    assert {e["dataset"] for e in episodes} == {"world"}
    for e in episodes:  # each question's other agent's episode, and nothing else
        (peer,) = e["peers"]
        other = episodes[peer]
        assert other["agent"] != e["agent"] and other["question_id"] == e["question_id"]
    assert sum(e["outcome"] != episodes[e["peers"][0]]["outcome"] for e in episodes[:20]) > 0


def test_a_benchmark_pair_file_names_its_agent_and_dataset(eval_file: Path, tmp_path: Path) -> None:
    pair = tmp_path / "pairs" / "oracle-0a1b2c3d" / "hotpotqa_small.jsonl"
    pair.parent.mkdir(parents=True)
    shutil.copy(eval_file, pair)
    (pair.parent / "hotpotqa_small.jsonl.run.json").write_text(json.dumps({"agent": "mine:Agent"}))
    out = tmp_path / "page.html"
    assert main(["view", str(pair), "--out", str(out)]) == 0
    assert {(e["agent"], e["dataset"]) for e in page_data(out)["episodes"]} == {
        ("mine:Agent", "hotpotqa_small")
    }


# -- colouring by log-probabilities ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two untrained tiny checkpoints (different seeds)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from searchgym.agents.training.checkpoint import save_checkpoint
    from searchgym.agents.training.config import ModelConfig
    from searchgym.agents.training.policy import build_policy

    folder = tmp_path_factory.mktemp("ckpt")
    paths = []
    for seed in (3, 4):
        policy, arch = build_policy(ModelConfig(tiny_layers=1, tiny_hidden=32), weights_seed=seed)
        path = folder / f"s{seed}.pt"
        save_checkpoint(path, {"kind": "sft", "model": policy.model.state_dict(), "arch": arch, "step": 0})
        paths.append(path)
    return paths[0], paths[1]


def independent_logprobs(checkpoint: Path, ids: list[int]) -> list[float]:
    """``log p(x_t | x_<t)`` of every token by one plain forward pass of the checkpoint's model."""
    import torch

    from searchgym.agents.training.export import load_policy

    policy = load_policy(checkpoint)
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([ids])).logits[0, :-1, : policy.tokenizer.vocab_size]
        logp = torch.log_softmax(logits.double(), dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return [0.0, *logp.tolist()]


def expected_policy_tokens(record: dict[str, Any]) -> tuple[list[int], list[list[int]]]:
    """The episode's ids and, per policy segment, the positions of its tokens."""
    tok = load_tokenizer(None)
    if "transcript" in record:
        pieces = [(s.source, tok.encode(s.text)) for s in split_transcript_text(record["transcript"])]
    else:
        pieces = [("prompt", record["prompt_ids"])]
        for i, m in zip(record["completion_ids"], record["env_mask"], strict=True):
            source = "policy" if m else "tool"
            if pieces[-1][0] == source:
                pieces[-1][1].append(i)
            else:
                pieces.append((source, [i]))
    ids, positions = [], []
    for source, seg in pieces:
        if source == "policy":
            positions.append(list(range(len(ids), len(ids) + len(seg))))
        ids += seg
    return ids, positions


def test_policy_tokens_carry_their_log_probs_under_the_checkpoint(
    checkpoints: tuple[Path, Path], records: list[dict[str, Any]], tmp_path: Path
) -> None:
    rows = [*records[:3], export_row("trl"), export_row("trl", answer="Bob")]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    out = tmp_path / "mixed.html"
    assert (
        main(["view", str(path), "--checkpoint", str(checkpoints[0]), "--batch-size", "2", "--out", str(out)])
        == 0
    )
    data = page_data(out)
    assert data["meta"]["colour"] == {"mode": "logp", "label": str(checkpoints[0])}
    for episode, record in zip(data["episodes"], rows, strict=True):
        ids, positions = expected_policy_tokens(record)
        expected = independent_logprobs(checkpoints[0], ids)
        turns = [t for t in episode["turns"] if "tokens" in t]
        assert len(turns) == len(positions) > 0
        for turn, where in zip(turns, positions, strict=True):
            assert "".join(piece for piece, _ in turn["tokens"]) == turn["text"]
            assert len(turn["tokens"]) == len(where)
            for (_, value), k in zip(turn["tokens"], where, strict=True):
                assert value == pytest.approx(expected[k], abs=2e-4)


def test_against_a_second_checkpoint_the_tokens_carry_both_log_probs(
    checkpoints: tuple[Path, Path], records: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "two.jsonl", records[:2])
    out = tmp_path / "two.html"
    argv = ["view", str(path), "--checkpoint", str(checkpoints[0]), "--against", str(checkpoints[1])]
    assert main([*argv, "--out", str(out)]) == 0
    data = page_data(out)
    assert data["meta"]["colour"]["mode"] == "delta"
    assert data["meta"]["colour"]["against_label"] == str(checkpoints[1])
    moved = []
    for episode, record in zip(data["episodes"], records, strict=False):
        ids, positions = expected_policy_tokens(record)
        a, b = independent_logprobs(checkpoints[0], ids), independent_logprobs(checkpoints[1], ids)
        turns = [t for t in episode["turns"] if "tokens" in t]
        for turn, where in zip(turns, positions, strict=True):
            for (_, lp, lp2), k in zip(turn["tokens"], where, strict=True):
                assert (lp, lp2) == (pytest.approx(a[k], abs=2e-4), pytest.approx(b[k], abs=2e-4))
                moved.append(abs(lp - lp2))
    assert max(moved) > 1e-3  # two seeds: the difference is not zero everywhere


def test_without_a_checkpoint_export_rows_are_coloured_by_their_rollout_log_probs(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [export_row("trl")])
    out = tmp_path / "t.html"
    assert main(["view", str(path), "--out", str(out)]) == 0
    data = page_data(out)
    assert data["meta"]["colour"]["mode"] == "logp"
    row = export_row("trl")
    expected = [v for v, m in zip(row["logprobs"], row["env_mask"], strict=True) if m]
    values = [v for t in data["episodes"][0]["turns"] for _, v in t["tokens"]]
    assert values == pytest.approx(expected, abs=1e-5)


# -- the page in a browser ---------------------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def haystack(episode: dict[str, Any]) -> str:
    """What the page's text box searches, as the page builds it."""
    parts = [episode["question"], episode["question_id"] or "", episode["answer"] or ""]
    parts += [" ".join(episode["golden_answers"]), episode["dataset"]]
    for t in episode["turns"]:
        parts += [t["text"], t["query"] or "", t.get("tool") or ""]
        for p in t["passages"]:
            parts += [p["title"], p["text"], p["id"] or ""]
    return "\n".join(parts).lower()


@pytest.mark.slow
def test_the_page_works_in_a_headless_browser(
    records: list[dict[str, Any]], eval_file: Path, oracle_file: Path, tmp_path: Path
) -> None:
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is absent (Debian: apt-get install chromium; `make unit` installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is part of the dev extra")
    image = pytest.importorskip("PIL.Image", reason="Pillow (a matplotlib dependency) decodes the screenshot")
    broken = dict(records[1])
    broken["transcript"] = broken["transcript"].replace(") ", f") {SCRIPT_BREAKER} ", 1)
    a = write_jsonl(tmp_path / "a.jsonl", [broken, *records[2:12]])
    b = write_jsonl(tmp_path / "b.jsonl", [*records[12:], eval_record(), export_row("verl")])
    out = tmp_path / "page.html"
    assert main(["view", str(a), str(b), "--out", str(out)]) == 0
    episodes = page_data(out)["episodes"]
    total = len(episodes)
    two = tmp_path / "two.html"
    assert main(["view", str(eval_file), str(oracle_file), "--out", str(two)]) == 0
    paired = page_data(two)["episodes"]

    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on(
                "console",
                lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.goto(out.as_uri())
            shown = page.locator("#shown-count")
            visible = page.locator("details.episode:visible")

            def count() -> int:
                n = int(shown.text_content() or "-1")
                assert visible.count() == n
                return n

            assert count() == total
            for value in ("correct", "wrong", "no_answer"):
                page.click(f"#filter-outcome button[data-value='{value}']")
                assert count() == sum(e["outcome"] == value for e in episodes) > 0
            page.click("#filter-outcome button[data-value='near_miss']")
            assert count() == sum(bool(e["near_miss"]) for e in episodes)
            page.click("#filter-outcome button[data-value='all']")
            for searches in sorted({e["searches"] for e in episodes}):
                page.select_option("#filter-searches", str(searches))
                assert count() == sum(e["searches"] == searches for e in episodes) > 0
            page.select_option("#filter-searches", "all")
            for name in ("a.jsonl", "b.jsonl"):
                page.select_option("#filter-dataset", name)
                assert count() == sum(e["dataset"] == name for e in episodes) > 0
            page.select_option("#filter-dataset", "all")
            word = episodes[3]["question"].split()[-1].lower()
            page.fill("#filter-text", word)
            assert count() == sum(word in haystack(e) for e in episodes) < total
            page.fill("#filter-text", "")
            assert count() == total

            item = page.locator("details.episode[data-index='0']")
            assert item.locator(".turn").count() == 0
            item.locator("summary").click()
            turns = item.locator(".turn")
            turns.first.wait_for(state="visible")  # the body is built by the toggle event, which is queued
            assert turns.count() == len(episodes[0]["turns"])
            assert SCRIPT_BREAKER in (item.locator("ol.passages li").first.text_content() or "")
            assert page.title().startswith("searchgym view")  # the passage's script never ran
            for name in ("a.jsonl", "b.jsonl"):  # every filter's values show the episodes each would show
                n = sum(e["dataset"] == name for e in episodes)
                assert (
                    page.locator(f"#filter-dataset option[value='{name}']").text_content() == f"{name} ({n})"
                )
            page.click("#filter-outcome button[data-value='correct']")
            n = sum(e["dataset"] == "a.jsonl" and e["outcome"] == "correct" for e in episodes)
            assert page.locator("#filter-dataset option[value='a.jsonl']").text_content() == f"a.jsonl ({n})"
            page.click("#filter-outcome button[data-value='all']")

            # Two agents: an agent column and filter, and one question's two episodes side by side.
            page.goto(two.as_uri())
            assert page.locator("#filter-agent option[value='oracle']").text_content() == "oracle (20)"
            page.select_option("#filter-agent", "oracle")
            assert count() == 20
            assert page.locator("details.episode:visible .agent").first.text_content() == "oracle"
            page.select_option("#filter-agent", "all")
            assert page.locator("#compare-b option[value='oracle']").text_content() == "oracle (20)"
            page.select_option("#compare-a", "heuristic")
            page.select_option("#compare-b", "oracle")
            pairs = page.locator("details.pair")
            assert page.locator("#pair-count").text_content() == "20" and pairs.count() == 20
            wrong = [i for i, e in enumerate(paired[:20]) if e["outcome"] != "correct"]
            assert wrong and page.locator("details.pair[data-differs='true']").count() >= len(wrong)
            for i in range(
                20
            ):  # the oracle is right everywhere: a pair differs wherever the heuristic is wrong
                if i in wrong:
                    assert pairs.nth(i).get_attribute("data-differs") == "true"
            pair = pairs.nth(wrong[0])
            pair.locator("summary").click()
            sides = pair.locator(".side-by-side > div")
            sides.first.wait_for(state="visible")
            assert [sides.nth(k).locator("h2").text_content() for k in (0, 1)] == ["heuristic", "oracle"]
            for k in (0, 1):  # the answers differ, and both sides mark them; the golden answers do not
                marked = sides.nth(k).locator("dt.differs")
                assert "answer" in marked.all_text_contents()
                assert "golden answers" not in marked.all_text_contents()
            page.click("#filter-outcome button[data-value='wrong']")  # the filters apply to the first agent
            assert page.locator("#pair-count").text_content() == str(len(wrong))
            shot = tmp_path / "page.png"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    assert errors == []
    with image.open(shot) as png:
        assert len(png.convert("RGB").getcolors(maxcolors=1 << 20) or ()) > 1


def test_near_miss_pages_show_the_wrong_answers_that_hold_the_gold(
    records: list[dict[str, Any]], tmp_path: Path
) -> None:
    edited = [dict(r) for r in records[:6]]
    edited[1].update(em=0.0, answer=f"{edited[1]['golden_answers'][0]} and more")  # holds the gold
    edited[2].update(em=0.0, answer="nothing like it")
    edited[3].update(em=1.0, answer=edited[3]["golden_answers"][0])
    path = write_jsonl(tmp_path / "edited.jsonl", edited)
    page = tmp_path / "all.html"
    assert main(["view", str(path), "--out", str(page)]) == 0
    kinds = [e["near_miss"] for e in page_data(page)["episodes"]]
    assert kinds[1] == "contains_gold" and kinds[2] is None and kinds[3] is None
    assert main(["view", str(path), "--near-miss", "--out", str(page)]) == 0
    shown = page_data(page)["episodes"]
    assert [e["answer"] for e in shown] == [e["answer"] for e, k in zip(edited, kinds, strict=True) if k]
    assert all(e["near_miss"] for e in shown) and edited[1]["answer"] in [e["answer"] for e in shown]
