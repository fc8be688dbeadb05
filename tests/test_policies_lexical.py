from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.lexical import bm25_scores, tokenize_for_search


def test_tokenize_splits_identifiers_and_keeps_them_whole() -> None:
    assert tokenize_for_search("parseHTTPResponse_v2(x)") == [
        "parsehttpresponse_v2",
        "parse",
        "http",
        "response",
        "v2",
    ]
    assert tokenize_for_search("load_kv_state") == ["load_kv_state", "load", "kv", "state"]
    assert tokenize_for_search("getUser.name a I") == ["getuser", "get", "user", "name"]
    assert tokenize_for_search("src/app/server.py:12") == ["src", "app", "server", "py", "12"]
    assert tokenize_for_search("") == []


def test_bm25_prefers_the_unit_with_the_terms() -> None:
    units = [
        "def load_config(path):\n    return toml.load(path)\n",
        "def save_state(session):\n    write(session.kv)\n",
        "class Registry:\n    pass\n",
    ]
    scores = bm25_scores(units, "where do we save the session state?")
    assert scores[1] > scores[0] and scores[1] > scores[2]
    assert scores[2] == 0.0
    # A camelCase query matches the snake_case definition through shared parts.
    scores = bm25_scores(units, "loadConfig")
    assert scores[0] == max(scores) > 0


def test_bm25_rare_terms_weigh_more_and_length_normalises() -> None:
    units = ["common rare", "common filler", "common filler", "common filler"]
    s = bm25_scores(units, "rare common")
    assert s[0] > s[1]
    short = ["alpha beta", "alpha " + "pad " * 40, "zzz", "yyy"]
    s = bm25_scores(short, "alpha")
    assert s[0] > s[1] > 0


def test_bm25_degenerate_inputs() -> None:
    assert bm25_scores([], "anything") == []
    assert bm25_scores(["a", ""], "word") == [0.0, 0.0]
    assert bm25_scores(["word here"], "") == [0.0]


@given(st.lists(st.text(max_size=60), max_size=12), st.text(max_size=40))
def test_bm25_is_deterministic_and_non_negative(units: list[str], request: str) -> None:
    a = bm25_scores(units, request)
    b = bm25_scores(list(units), request)
    assert a == b
    assert len(a) == len(units)
    assert all(s >= 0.0 for s in a)
    for tok in tokenize_for_search(request):
        assert len(tok) >= 2 and tok == tok.lower()


def test_inflections_match_their_stem() -> None:
    # Issue 12: "why did the jobs fail?" against a log whose failing lines say FAILED.
    units = ["step 1: ok, all good\n", "FAILED: disk quota exceeded\n", "unrelated output here\n"]
    scores = bm25_scores(units, "Why did the jobs fail? Read the log.")
    assert scores[1] > 0 and scores[1] > scores[0] and scores[1] > scores[2]
    assert tokenize_for_search("FAILED jobs") == ["failed", "fail", "jobs", "job"]


@given(st.from_regex(r"[a-z]{1,12}", fullmatch=True))
def test_stem_is_a_prefix_or_a_known_rewrite(word: str) -> None:
    from policies.lexical import stem

    root = stem(word)
    assert root == word or word.startswith(root) or (word.endswith("ies") and root == word[:-3] + "y")
    assert len(root) >= min(len(word), 3)
