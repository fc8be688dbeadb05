"""Tool outputs sent as user messages, in the real agents' own wrappers: recognised as tool outputs,
and the request a new one is ranked against is the agent's own last turn (issue 40)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.conversation_types import Message
from policies.observations import (
    agent_command,
    is_harness_message,
    message_kind,
    observation_agent,
    without_command,
    wrapper_lines,
)
from policies.rendering import split_lines
from policies.request_finding import find_request


def words(text: str) -> int:
    return len(text.split())


# mini-swe-agent's templates (config/default.yaml of SWE-agent/mini-swe-agent), as its sessions in
# ../shared/data show them.
MINI_SYSTEM = ("You are a helpful assistant that can interact multiple times with a computer shell to solve "
               "programming tasks.\nYour response must contain exactly ONE bash code block with ONE command.")
MINI_TOO_LONG = (
    "<returncode>0</returncode>\n<warning>\nThe output of your last command was too long.\n"
    "Please try a different command that produces less output.\n"
    "If you're looking at a file you can try use head, tail or sed to view a smaller number of lines selectively.\n"
    "</warning><output_head>\n{head}\n</output_head>\n<elided_chars>\n1234 characters elided\n</elided_chars>\n"
    "<output_tail>\n{tail}\n</output_tail>"
)
MINI_FORMAT_ERROR = ("Please always provide EXACTLY ONE action in triple backticks, found 2 actions.\n\n"
                     "Please format your action in triple backticks as shown in <response_example>.")


def mini_output(body: str, returncode: int = 0) -> str:
    return f"<returncode>{returncode}</returncode>\n<output>\n{body}\n</output>"


def mini_turn(thought: str, command: str) -> Message:
    return Message("assistant", f"THOUGHT: {thought}\n\n```bash\n{command}\n```")


TASK = "<pr_description>\nConsider the following PR description:\nInvoice totals apply the tax rate twice.\n</pr_description>"


def mini_session(previous: str, target: str) -> list[Message]:
    """The shape that lost: the previous user message is the previous tool output (long) and a
    harness complaint sits between turns."""
    return [
        Message("system", MINI_SYSTEM),
        Message("user", TASK),
        mini_turn("List the repository.", "ls -R"),
        Message("user", previous),
        Message("assistant", "I will grep and then read."),
        Message("user", MINI_FORMAT_ERROR),
        mini_turn("I need to see how compute_invoice_total applies the rate.", "sed -n '1,400p' billing/invoice.py"),
        Message("user", target),
    ]


def test_each_agents_real_wrapper_is_a_tool_output() -> None:
    shapes = {
        mini_output("a\nb"): "mini-swe-agent",
        MINI_TOO_LONG.format(head="a", tail="b"): "mini-swe-agent",
        "The last command <command>sleep 999</command> timed out and has been killed.\nThe output of the command "
        "was:\n <output>\n\n</output>\nPlease try another command": "mini-swe-agent",
        "OBSERVATION:\nfile.py:12: def f():": "swe-agent",
        "Your command ran successfully and did not produce any output.": "swe-agent",
        "<exception>An error occurred while executing the command: boom</exception>\n<returncode>-1</returncode>\n"
        "<output>\n</output>": "mini-swe-agent",
        "Observation: file.py": "swe-agent",
        "Old environment output: (12 lines omitted)": "swe-agent",
        "EXECUTION RESULT of [execute_bash]:\ntotal 12\n[The command completed with exit code 0.]": "openhands",
        "OBSERVATION:\nok\n[Command 3 finished with exit code 0]": "swe-agent",
        "total 12\ndrwxr-xr-x 2 a a 4096 .\n[Command finished with exit code 1]": "openhands",
        "I ran this command:\n\npytest -x\n\nAnd got this output:\n\nFAILED test_a.py::test_b\n": "aider",
        "# Fix any errors below, if possible.\n\n## Running: flake8 a.py\n\na.py:3:1: F401": "aider",
    }
    for text, agent in shapes.items():
        assert observation_agent(text) == agent, text
        assert message_kind(Message("user", text)) == "tool_output"
    for harness in (MINI_FORMAT_ERROR, "Format error:\n\n<error>\nExpected exactly 1 action, found 2.\n</error>",
                    "Your output was not formatted correctly. You must always include one discussion and one command",
                    "Your last output did not use any tool calls!",
                    "I added these files to the chat: a.py\nLet me know if there are others we should add."):
        assert is_harness_message(harness) and message_kind(Message("user", harness)) == "harness", harness
    # The user's own words, a paste, a tool message, and text quoting a wrapper mid-message.
    assert message_kind(Message("user", "Why does <returncode>1</returncode> show up in CI?")) == "user"
    assert message_kind(Message("user", "Traceback (most recent call last):\n  File ...")) == "user"
    assert message_kind(Message("tool", "x", tool_call_id="c")) == "tool_output"
    assert message_kind(Message("assistant", mini_output("x"))) == "assistant"


def test_the_command_and_the_intent_of_an_agent_turn() -> None:
    turn = "THOUGHT: Read the loader.\n\n```bash\nsed -n '1,80p' sessions/store.py\n```"
    assert agent_command(turn) == "sed -n '1,80p' sessions/store.py"
    assert without_command(turn) == "THOUGHT: Read the loader."
    assert agent_command("```\nfirst\n```\nthen\n```bash\nsecond\n```") == "second"
    assert agent_command("No command this time.") is None
    openhands = ("Let me list it.\n<function=execute_bash>\n<parameter=command>\nls -la /workspace\n</parameter>\n"
                 "</function>")
    assert agent_command(openhands) == "execute_bash ls -la /workspace"
    assert without_command(openhands) == "Let me list it."


def test_the_wrapper_lines_are_the_return_code_warning_and_output_tag() -> None:
    text = MINI_TOO_LONG.format(head="line 1\nline 2", tail="line 9")
    first, last = wrapper_lines(text)
    lines = split_lines(text)
    assert first == 0 and lines[last].rstrip("\n").endswith("<output_head>")
    assert "line 1" not in "".join(lines[: last + 1])
    plain = mini_output("a\nb")
    assert wrapper_lines(plain) == (0, 1)
    assert wrapper_lines("just text\nmore") is None


def test_the_agents_turn_leads_and_no_earlier_output_or_warning_enters_the_request() -> None:
    previous = MINI_TOO_LONG.format(head="\n".join(f"./pkg/module_{i}.py" for i in range(400)), tail="./setup.py")
    target = mini_output("\n".join(f"line {i}" for i in range(500)))
    msgs = mini_session(previous, target)
    r = find_request(msgs, len(msgs) - 1, words)
    assert "sed -n '1,400p' billing/invoice.py" in r.scored
    assert "how compute_invoice_total applies the rate" in r.scored
    assert "tax rate twice" in r.scored  # the task, after the agent's turn in priority
    assert "module_" not in r.scored and "too long" not in r.scored  # the previous output and its warning
    assert "EXACTLY ONE" not in r.scored  # the harness's complaint
    assert r.answers_call  # ranked as an output whose producing command is known
    assert r.pinned_lines == (0, 1)  # <returncode>, <output>
    # A tight budget keeps the command first.
    tight = find_request(msgs, len(msgs) - 1, words, max_scored_tokens=6)
    assert "sed -n '1,400p' billing/invoice.py" in tight.scored


def test_a_follow_up_question_of_the_user_is_still_the_question() -> None:
    """Aider-like: the user asks, the agent runs a command, its output comes back as a user message."""
    msgs = [
        Message("user", "Why do invoices double the tax?"),
        mini_turn("Check the billing module.", "grep -n tax billing.py"),
        Message("user", mini_output("12: tax = rate * 2")),
        Message("assistant", "Found it."),
        Message("user", "And where is the rate read from?"),
        mini_turn("Read the settings loader.", "cat settings.py"),
        Message("user", mini_output("\n".join(f"x{i}" for i in range(300)))),
    ]
    scored = find_request(msgs, 6, words).scored
    assert "where is the rate read from" in scored and "cat settings.py" in scored
    assert "tax = rate * 2" not in scored


_word = st.text(alphabet="abcdefghij", min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    history=st.lists(st.tuples(st.sampled_from(["output", "warning", "complaint", "question"]),
                               st.lists(_word, min_size=1, max_size=60)), max_size=6),
    command=st.lists(_word, min_size=1, max_size=8),
    budget=st.integers(min_value=1, max_value=400),
)
def test_property_the_command_fits_first_and_no_earlier_output_leads(
    history: list[tuple[str, list[str]]], command: list[str], budget: int
) -> None:
    """Whatever came before, the request holds as much of the agent's command as the budget allows,
    and no text of an earlier tool output, warning or harness complaint."""
    msgs = [Message("system", MINI_SYSTEM), Message("user", TASK)]
    for n, (kind, body) in enumerate(history):
        msgs.append(mini_turn(f"step {n}", f"echo step{n}"))
        marked = " ".join(f"OLD{w}" for w in body)
        msgs.append(Message("user", {
            "output": mini_output(marked),
            "warning": MINI_TOO_LONG.format(head=marked, tail=marked),
            "complaint": MINI_FORMAT_ERROR + "\n" + marked,
            "question": f"Please also check {' '.join(body)}?",
        }[kind]))
    cmd = " ".join(f"CMD{w}" for w in command)
    msgs.append(mini_turn("Read it.", cmd))
    msgs.append(Message("user", mini_output("\n".join(f"row {i}" for i in range(50)))))
    r = find_request(msgs, len(msgs) - 1, words, max_scored_tokens=budget)
    assert words(r.scored) <= budget
    assert "OLD" not in r.scored and "too long" not in r.scored and "EXACTLY ONE" not in r.scored
    expected = cmd if len(command) <= budget else " ".join(cmd.split()[:budget])
    assert expected in r.scored


# Per agent: how its turn writes a command, and how its harness wraps the output.
AGENT_SHAPES = {
    "mini-swe-agent": (lambda c: f"THOUGHT: Look closer.\n\n```bash\n{c}\n```", mini_output),
    "swe-agent": (lambda c: f"DISCUSSION\nLook closer.\n\n```\n{c}\n```", lambda o: f"OBSERVATION:\n{o}"),
    "openhands": (lambda c: f"Look closer.\n<function=execute_bash>\n<parameter=command>\n{c}\n</parameter>\n</function>",
                  lambda o: f"EXECUTION RESULT of [execute_bash]:\n{o}\n[The command completed with exit code 0.]"),
    "aider": (lambda c: f"Look closer by running:\n\n```bash\n{c}\n```",
              lambda o: f"I ran this command:\n\ncmd\n\nAnd got this output:\n\n{o}\n"),
}


def test_a_request_for_each_agent_shape() -> None:
    for agent, (turn, wrap) in AGENT_SHAPES.items():
        msgs = [
            Message("system", "You are an agent."),
            Message("user", "Fix the doubled tax in invoices."),
            Message("assistant", turn("grep -rn tax .")),
            Message("user", wrap("\n".join(f"OLDHIT{i} tax" for i in range(200)))),
            Message("assistant", turn("sed -n '1,200p' billing/invoice.py")),
            Message("user", wrap("\n".join(f"row {i}" for i in range(300)))),
        ]
        assert message_kind(msgs[-1]) == "tool_output", agent
        r = find_request(msgs, 5, words, max_scored_tokens=40)
        assert "sed -n '1,200p' billing/invoice.py" in r.scored, agent
        assert "Look closer" in r.scored and "doubled tax" in r.scored, agent
        assert "OLDHIT" not in r.scored and r.answers_call, agent


def test_a_tool_output_sent_as_user_is_not_a_question_for_the_recall_gate() -> None:
    """The gate runs on what the user asks; a later output in a user message asks nothing."""
    from gateway.turns import TurnService
    from policies.kept_lines import KeptLineMap, content_hash
    from sessions.record import SessionRecord

    record = SessionRecord(session_id="o" * 64, tenant="")
    compressed = mini_output("\n".join(f"row {i}" for i in range(40)))
    record.add_kept_map(KeptLineMap(content_hash(compressed), ((0, 3),), 100, 20, "r"), "earlier", {})
    asked = [Message("user", TASK), mini_turn("Read.", "cat a.py"), Message("user", compressed),
             Message("assistant", "Done reading."), Message("user", "Which row holds the total?")]
    assert TurnService._is_new_question(asked, 4, record)
    ran = [*asked[:3], mini_turn("Next.", "cat b.py"), Message("user", mini_output("short"))]
    assert not TurnService._is_new_question(ran, 4, record)
    complaint = [*asked[:3], Message("assistant", "no command"), Message("user", MINI_FORMAT_ERROR)]
    assert not TurnService._is_new_question(complaint, 4, record)
