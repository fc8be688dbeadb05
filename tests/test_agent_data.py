"""The frozen split and the long outputs built from agent sessions (issue 12): pure, no model."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.training.agent_data import build_long_outputs, gold_key, terminal_log, tool_outputs, used_later
from benchmarks.training.splits import SPLITS_FILE, deal, split_of


def _session(sid: str, gold: str = "    return a - b  # wrong sign") -> dict:
    def turn(thought: str, cmd: str) -> dict:
        return {"role": "assistant", "content": f"THOUGHT: {thought}\n\n```bash\n{cmd}\n```"}

    def out(body: str) -> dict:
        return {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{body}</output>"}

    return {
        "id": sid,
        "issue": "<pr_description>\nConsider the following PR description:\nadd() subtracts\n</pr_description>",
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "fix it"},
            turn("Find the function.", "grep -rn 'def add_numbers' src"),
            out("src/calc.py:10:def add_numbers(a, b):\nsrc/other.py:3:def add_numbersed():\n"),
            turn("Open it.", "nl -ba src/calc.py | sed -n '8,14p'"),
            out("     8\timport math\n     9\t\n    10\tdef add_numbers(a, b):\n    11\t" + gold.strip() + "\n    12\t\n"),
            turn("Edit line 11 of calc.py in add_numbers.", "sed -i '11s/-/+/' src/calc.py"),
            out(""),
        ],
        "patch": "--- a/src/calc.py\n+++ b/src/calc.py\n-" + gold + "\n+    return a + b\n",
        "gold_lines": [gold],
        "gold_hits": [[5, 3]],
    }


def test_tool_outputs_pair_each_output_with_the_turn_that_asked() -> None:
    outs = tool_outputs(_session("repo__x-1"))
    assert [o.command for o in outs][:2] == ["grep -rn 'def add_numbers' src", "nl -ba src/calc.py | sed -n '8,14p'"]
    assert outs[1].thought == "Open it."
    assert outs[1].lines[2] == "    10\tdef add_numbers(a, b):\n"
    assert terminal_log(_session("repo__x-1"))[0] == "$ grep -rn 'def add_numbers' src\n"


def test_weak_labels_mark_what_the_agent_went_on_to_use() -> None:
    record = _session("repo__x-1")
    grep, opened = tool_outputs(record)[:2]
    # The grep hit in calc.py, a file the agent then opened; not the one in other.py.
    assert used_later(record, grep) == [True, False]
    flags = used_later(record, opened)
    assert flags[2] and flags[3]  # `def add_numbers` (named later) and line 11 (asked for by number, touched by the patch)
    assert not flags[0]  # `import math`: never used


def test_long_outputs_hold_the_sessions_own_text_at_a_seeded_depth() -> None:
    sessions = [_session(f"repo__x-{i}") for i in range(4)]
    outputs = build_long_outputs(sessions[:1], sessions, len, 900, 10_000, seed=0)
    kinds = {o.kind for o in outputs}
    assert kinds == {"session_log", "tool_output"}
    for o in outputs:
        assert len(o.text) >= 900  # the counter here is characters
        assert not all(o.own)  # padded with the other sessions' logs
        own = [line for line, mine in zip(o.lines, o.own) if mine]
        assert gold_key("    11\treturn a - b  # wrong sign") in {gold_key(x) for x in own}
        assert o.gold == frozenset({"return a - b  # wrong sign"})
        assert len(o.weak) == len(o.lines) and not any(w for w, mine in zip(o.weak, o.own) if not mine)
    again = build_long_outputs(sessions[:1], sessions, len, 900, 10_000, seed=0)
    assert [o.lines for o in again] == [o.lines for o in outputs]


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=4),
                       st.lists(st.text("0123456789", min_size=1, max_size=6), min_size=1, max_size=30),
                       max_size=8))
def test_deal_puts_every_member_in_one_split(raw: dict[str, list[str]]) -> None:
    groups = {g: [f"{g}__{m}" for m in ms] for g, ms in raw.items()}  # a session belongs to one repository
    assignment = deal(groups)
    members = {m for ms in groups.values() for m in ms}
    assert set(assignment) == members
    assert assignment == deal({g: list(reversed(ms)) for g, ms in groups.items()})  # order-free
    for ms in groups.values():
        if len(set(ms)) >= 3:
            sides = {assignment[m] for m in ms}
            assert "test" in sides and "validation" in sides


def test_the_committed_split_is_frozen_and_disjoint() -> None:
    doc = json.loads(SPLITS_FILE.read_text())
    swe = doc["splits"]["swe"]
    assert sum(doc["counts"]["swe"].values()) == len(swe) == 145
    assert doc["counts"]["swe"]["test"] >= 40
    assert split_of("swe", next(iter(swe))) in ("train", "validation", "test")
    repos_in_test_only = {sid.split("__")[0] for sid, side in swe.items() if side == "test"} - {
        sid.split("__")[0] for sid, side in swe.items() if side != "test"}
    assert repos_in_test_only  # some repositories no tuning ever saw


def test_train_head_builds_from_train_and_validation_and_the_report_from_test_alone() -> None:
    from dataclasses import replace

    from benchmarks.training.head_examples import BuildConfig

    training, report = BuildConfig(), replace(BuildConfig(), sides=("test",))
    splits = json.loads(SPLITS_FILE.read_text())["splits"]
    for kind in ("swe", "mtrag"):
        for key, side in splits[kind].items():
            assert training.takes(kind, key) == (side != "test"), (kind, key)
            assert report.takes(kind, key) == (side == "test"), (kind, key)
