"""Crash matrix (issue 14): SIGKILL at ten seeded points across turns 2-4 of a session whose turn 2
brought a ~20K-token tool output (compressed) and whose turn 3 triggered recall; after each kill,
a restart on the same store and the next turn. The transcript must equal, byte for byte, that of a
server that never failed; a control run with the record write-ahead off shows the check can fail."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import BenchContext, Section, md_table
from benchmarks.crash_matrix import ALL_POINTS, SEED, Run, Script, python_module, run_script
from gateway.process import GatewayProcess

TITLE = "Crash matrix: SIGKILL at ten points, transcripts against a server that never failed (issue 14)"
TOOL_TOKENS = 20_000
QUICK_TOOL_TOKENS = 2_000


def functions_for(tokens: int, count: Callable[[str], int]) -> int:
    """How many functions make the crash script's file read about `tokens` tokens long."""
    n = 40
    while count(python_module(n)) < tokens:
        n = int(n * 1.25) + 1
    return n


def run(ctx: BenchContext) -> Section:
    if ctx.model_path is None:
        return Section(TITLE, f"Skipped: no model ({ctx.model_error}).")
    tokens = QUICK_TOOL_TOKENS if ctx.quick else TOOL_TOKENS
    n = functions_for(tokens, ctx.count_tokens)
    output = python_module(n)
    # Defaults but the threshold, which the quick run lowers so its small output is still compressed.
    threshold = ["--threshold", "1500"] if ctx.quick else []
    # Relevance to the first question is flat over the helpers, so compression keeps the file's
    # head: the turn-3 question asks about one near its end, which it leaves out.
    script = Script(output, recall_helper=n - 3)
    work = ctx.cache_dir / "work" / f"crash-{uuid.uuid4().hex[:8]}"
    started: list[GatewayProcess] = []

    def start(*flags: str, store: Path) -> GatewayProcess:
        server = GatewayProcess(store, "--model", str(ctx.model_path), "--drafter", str(ctx.model_path),
                                "--n-ctx", "32768", *threshold, *flags, ready_timeout=300)
        started.append(server)
        return server

    points = ALL_POINTS[:3] if ctx.quick else ALL_POINTS
    try:
        reference = run_script(start, script, work / "reference", [])
        matrix = run_script(start, script, work / "matrix", points, reference=reference)
        control = run_script(start, script, work / "control", [(2, "after")], "--record-sync", "off",
                             reference=reference)
    finally:
        for server in started:
            server.stop()
    return Section(TITLE, report(reference, matrix, control, tool_tokens=ctx.count_tokens(output), quick=ctx.quick))


def report(reference: Run, matrix: Run, control: Run, tool_tokens: int, quick: bool) -> str:
    same_state = matrix.same_restore_turns(reference)
    rows = []
    for (answered, served), kill in zip(matrix.after_restart, matrix.kills):
        rows.append([kill, f"turn {answered}", "yes" if served == reference.transcripts[answered] else "**no**"])
    turn_rows = []
    for turn in (1, 2, 3, 4):
        source, cached = matrix.restored.get(turn, ("?", 0))
        ref_source, ref_cached = reference.restored.get(turn, ("?", 0))
        turn_rows.append([
            turn, "yes" if matrix.transcripts.get(turn) == reference.transcripts.get(turn) else "**no**",
            f"{source}, {cached:,}", f"{ref_source}, {ref_cached:,}",
            "yes" if matrix.answers.get(turn) == reference.answers.get(turn) else "no"
            + (" (same state: **a defect**)" if turn in same_state else " (other state)"),
        ])
    lost = sum(1 for _a, served in matrix.after_restart if served is None)
    equal_after = sum(1 for (a, served) in matrix.after_restart if served == reference.transcripts[a])
    equal_turns = sum(1 for t in (1, 2, 3, 4) if matrix.transcripts.get(t) == reference.transcripts.get(t))
    control_lost = control.after_restart and control.after_restart[0][1] != reference.transcripts[2]
    compressed = reference.headers[2].get("X-PFlash-Compressed") == "true"
    recalled = reference.headers[3].get("X-PFlash-Recall") == "true"
    failures = matrix.restore_failures()
    return (
        f"One session of four turns (turn 2: a {tool_tokens:,}-token file read, turn 3: a question about a "
        "function its compression left out) with a second session between turns, at RAM budget 0 so every "
        "switch spills the first session's KV to disk; default settings otherwise (`record_sync = \"batched\"`, "
        f"threshold {'1,500 in this quick run' if quick else '16,384'}, the default ranker), greedy answers of 12 tokens. "
        f"The reference is the same script on a server that never fails (turn 2 compressed: "
        f"{'yes' if compressed else '**no**'}; turn 3 recalled: {'yes' if recalled else '**no**'}). The matrix "
        f"kills the server with SIGKILL at {len(matrix.kills)} points (seed {SEED}) and restarts it on the "
        "same store; the client then resends its last request, as an agent retries.\n\n"
        "Right after each restart, the session's transcript (`GET /v1/sessions/{id}/transcript`) against the "
        "reference's after the last turn the client saw answered:\n\n"
        + md_table(["kill", "compared with", "transcript equal"], rows, align="llr")
        + "\nEach turn as the client finally got it (restored from, cached tokens: what the engine reused; the "
        "answer is compared where every turn so far reused the same state as the reference):\n\n"
        + md_table(["turn", "transcript equal", "restored, cached (matrix)", "restored, cached (reference)",
                    "answer equal"], turn_rows, align="lrrrl")
        + f"\n{equal_after} of {len(matrix.after_restart)} restarts served the reference's transcript at once and "
        f"{equal_turns} of 4 turns ended equal to it; {lost} sessions lost; {failures:.0f} KV restore failures. "
        "Control: the same kill right after turn 2 with the record write-ahead off (`--record-sync off`) "
        + ("loses the compressed history (the restarted server serves the file whole): the matrix can fail."
           if control_lost else "**did not lose the history: the control failed to show the check can fail.**")
        + "\n"
    )

