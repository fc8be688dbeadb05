"""Which text no call asked for reads as a transcript (policies/transcript.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.transcript import TRANSCRIPT_MIN_COMMANDS, edited_later_lines, is_unasked_transcript, looks_like_transcript

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


def test_output_of_a_file_a_later_command_edits_is_marked() -> None:
    """The agent viewed query.py (under two spellings of its path), then edited it in place; README
    was only read; the view after the edit is not followed by another edit."""
    log = ["$ nl -ba ./django/db/models/query.py | sed -n '10,12p'\n", "    10\tx = 1\n", "    11\ty = 2\n",
           "$ cat README.rst\n", "hello\n",
           "$ sed -i 's/x = 1/x = 3/' /testbed/django/db/models/query.py\n", "\n",
           "$ nl -ba django/db/models/query.py | sed -n '10p'\n", "    10\tx = 3\n"]
    assert edited_later_lines(log) == [False, True, True, False, False, False, False, False, False]


def test_claude_code_edits_and_redirects_count_as_edits() -> None:
    claude = ["⏺ Read(src/app/views.py)\n", "  def index(): ...\n", "⏺ Update(src/app/views.py)\n", "  ⎿ updated\n"]
    assert edited_later_lines(claude) == [False, True, False, False]
    redirect = ["$ cat tests/test_x.py\n", "def test(): pass\n", "$ cat <<'EOF' > tests/test_x.py\n"]
    assert edited_later_lines(redirect) == [False, True, False]
    read_only = ["$ grep -n total billing/invoice.py\n", "12: total = 0\n", "$ python -m pytest billing/invoice.py\n"]
    assert edited_later_lines(read_only) == [False, False, False]


_TRANSCRIPT_LINES = st.one_of(
    st.builds(lambda f: f"$ cat pkg/{f}.py\n", st.sampled_from("abc")),
    st.builds(lambda f: f"$ sed -i 's/x/y/' pkg/{f}.py\n", st.sampled_from("abc")),
    st.sampled_from(["x = 1\n", "\n", "done\n"]),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_TRANSCRIPT_LINES, max_size=30))
def test_a_line_is_marked_exactly_when_its_file_is_edited_after_it(lines: list[str]) -> None:
    shown, expected = None, []
    for i, line in enumerate(lines):
        if line.startswith("$ "):
            shown = line.split()[-1]
            expected.append(False)
        else:
            expected.append(shown is not None and any(
                later.startswith("$ sed -i") and later.split()[-1] == shown for later in lines[i + 1:]))
    assert edited_later_lines(lines) == expected
