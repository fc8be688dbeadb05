"""Which text no call asked for reads as a transcript (policies/transcript.py)."""

from __future__ import annotations

from policies.transcript import TRANSCRIPT_MIN_COMMANDS, is_unasked_transcript, looks_like_transcript

OUTPUT = ["collected 12 items\n", "tests/test_app.py ....F\n", "E   AssertionError\n"]


def test_several_commands_make_a_transcript() -> None:
    shell = [line for k in range(TRANSCRIPT_MIN_COMMANDS) for line in (f"$ pytest -k case{k}\n", *OUTPUT)]
    claude = [line for k in range(TRANSCRIPT_MIN_COMMANDS) for line in (f"⏺ Bash(pytest -k case{k})\n", *OUTPUT)]
    assert looks_like_transcript(shell) and looks_like_transcript(claude)
    assert not looks_like_transcript(shell[: 4 * (TRANSCRIPT_MIN_COMMANDS - 1)])  # one command short


def test_one_tool_output_is_no_transcript_whatever_it_repeats() -> None:
    assert not looks_like_transcript(OUTPUT * 100)
    assert not looks_like_transcript(["$\n", "$  \n", "cost: $ 12\n", "  $ indented\n"] * 5)


def test_only_a_transcript_without_its_call_is_unasked() -> None:
    log = [line for k in range(5) for line in (f"$ cat f{k}.py\n", *OUTPUT)]
    assert is_unasked_transcript(False, log)
    assert not is_unasked_transcript(True, log)  # its call says what is wanted
    assert not is_unasked_transcript(False, OUTPUT)
