import pytest

from searchgym.protocol import ParsedAction, StopScanner, format_information, format_prompt, parse_action
from searchgym.tokenization import builtin_tokenizer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<search> who </search>", ParsedAction("search", "who")),
        ("<think>hm</think>\n<search>a b</search>", ParsedAction("search", "a b")),
        ("<answer> Paris </answer>", ParsedAction("answer", "Paris")),
        ("<answer></answer>", ParsedAction("answer", "")),
        ("<search>   </search>", ParsedAction("invalid")),
        ("<answer>x</search>", ParsedAction("invalid")),
        ("no tags at all", ParsedAction("invalid")),
        ("<answer>x<search>q</search>", ParsedAction("search", "q")),
        ("<search>multi\nline</search>", ParsedAction("search", "multi\nline")),
    ],
)
def test_parse_action(text: str, expected: ParsedAction) -> None:
    assert parse_action(text) == expected


def test_prompt_contains_question_and_search_r1_example() -> None:
    prompt = format_prompt("  Who wrote X? ")
    assert prompt.endswith("Question: Who wrote X?\n")
    assert "<answer> Beijing </answer>" in prompt  # the example the env must never score


def test_format_information_search_r1_layout() -> None:
    text = format_information([("A", "one two three"), ("B", "four")], max_passage_words=2)
    assert text == '\n\n<information>Doc 1(Title: "A") one two\nDoc 2(Title: "B") four</information>\n\n'


def test_stop_scanner_finds_tag_split_over_tokens_and_keeps_trailing_bytes() -> None:
    tok = builtin_tokenizer()
    ids = tok.encode("<search> q </search>.And more")
    scanner = StopScanner(tok.token_bytes, tok.eos_token_id)
    stops = [scanner.feed(t) for t in ids]
    first = stops.index(True)
    assert tok.decode(ids[: first + 1]).find("</search>") >= 0
    assert "</search>" not in tok.decode(ids[:first])
    assert scanner.stop == "</search>"
    assert scanner.text(scanner.cut) == "<search> q </search>"
