"""The real clients: Claude Code and Codex CLI binaries (pinned npm releases, installed into the
benchmark's cache) against a live gateway on the small model. Each runs a task, then continues it
in a second invocation (`claude -p --continue`, `codex exec resume --last`); a recording proxy
between client and gateway logs every request: its kind, the conversation the gateway chose, its
status, and how much of its prompt came from the cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import BenchContext, Section, md_table
from benchmarks.recording_proxy import Exchange, RecordingProxy
from gateway.process import GatewayProcess

TITLE = "Real clients: Claude Code and Codex CLI"
CLAUDE = "@anthropic-ai/claude-code@2.1.328"
CODEX = "@openai/codex@0.169.0"
ANSWER_LIMIT = 1024  # --max-tokens-limit: Claude Code asks for 32,000 tokens a turn
INVOCATION_TIMEOUT_S = 1200
# Measured while building this section, by hand on captures/claude/001: the base model echoes the
# system prompt, then repeats one line; with 3,000 tokens allowed and no loop guard it ran to the
# limit (`max_tokens`, which Claude Code answers with "Output token limit hit. Resume directly",
# three times, then exit 1); repeated_line_stop (default 32) ended it at 507 tokens, `end_turn`.
# Sampled at Claude Code's temperature its loops vary a little from line to line, and run on.
BASE_MODEL_NOTE = (
    "Why a client can fail here: Gemma 3 270M is a base model. On Claude Code's prompt it echoes the system "
    "prompt, then loops: when on one exact line the gateway ends the answer after 32 repeats "
    "(`repeated_line_stop`, as a stop); when on long lines that vary a little, it runs to the answer limit, and "
    "Claude Code, on `max_tokens`, asks three times to resume, then exits 1. "
    "The served default, Qwen2.5-Coder-0.5B-Instruct, ends its turns but (tried by hand) calls a tool that "
    "does not exist (`gitStatus`, from the git status in Claude Code's reminder) until `--max-turns`.")
GOAL_REUSE = 0.95  # the second invocation's first main request reuses the first's prompt
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


@dataclass(frozen=True)
class Invocation:
    client: str
    label: str
    argv: list[str]
    rc: int
    seconds: float
    tail: str
    ending: str  # how the client said it ended (its last JSON event)


def ending_of(stdout: str) -> str:
    """Claude Code's result event (`terminal_reason`, the API error it gave up on) or Codex's last
    event type, from their JSON output."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "result":
            reason = event.get("terminal_reason") or event.get("subtype", "")
            return reason + (f" ({event['api_error']})" if event.get("api_error") else "")
        return str(event.get("type", "?"))
    return "no JSON output"


def install(ctx: BenchContext) -> Path | str:
    """The pinned client releases in the benchmark's cache; why not, as a sentence."""
    folder = ctx.cache_dir / "clients"
    bins = folder / "node_modules" / ".bin"
    if (bins / "claude").exists() and (bins / "codex").exists():
        return bins
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed"
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", CLAUDE, CODEX],
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return f"npm install failed: {done.stderr.strip()[-300:]}"
    return bins


def workspace(root: Path, calc: str = CALC) -> tuple[Path, Path]:
    """A fresh home and a small git repository to work in, holding calc.py."""
    home, repo = root / "home", root / "repo"
    shutil.rmtree(root, ignore_errors=True)
    home.mkdir(parents=True)
    repo.mkdir()
    (repo / "calc.py").write_text(calc)
    for argv in (["git", "init", "-q"], ["git", "add", "."],
                 ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, check=True)
    return home, repo


def run_client(proxy: RecordingProxy, client: str, label: str, argv: list[str], repo: Path,
               env: dict[str, str], timeout_s: float = INVOCATION_TIMEOUT_S) -> Invocation:
    proxy.label = f"{client} {label}"
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)
        rc, out, err = done.returncode, done.stdout, done.stderr
        tail, ending = (out + err).strip()[-400:], ending_of(out)
    except subprocess.TimeoutExpired as stopped:
        # What it wrote before the limit is kept: the events of a run that never ended are the evidence.
        out, err = (as_text(stopped.stdout), as_text(stopped.stderr))
        rc, tail, ending = 124, f"timed out after {timeout_s:.0f} s", "timeout"
    (repo.parent / f"{label.replace(' ', '_')}.out").write_text(out + "\n--- stderr\n" + err)
    return Invocation(client, label, argv, rc, time.perf_counter() - started, tail, ending)


def as_text(output: str | bytes | None) -> str:
    """A stopped child's partial output, which subprocess leaves undecoded."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def claude_env(home: Path, proxy: RecordingProxy) -> dict[str, str]:
    """Claude Code against the proxy: every model tier the local one, no updater, no telemetry."""
    return {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": proxy.url, "ANTHROPIC_AUTH_TOKEN": "unused",
            "ANTHROPIC_MODEL": "pflash-local", "ANTHROPIC_DEFAULT_OPUS_MODEL": "pflash-local",
            "ANTHROPIC_DEFAULT_SONNET_MODEL": "pflash-local", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "pflash-local",
            "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}


def codex_env(home: Path, proxy: RecordingProxy) -> dict[str, str]:
    """Codex with a `pflash` provider on the proxy (the Responses API)."""
    (home / ".codex").mkdir(exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        'model = "pflash-local"\nmodel_provider = "pflash"\n\n[model_providers.pflash]\nname = "pflash"\n'
        f'base_url = "{proxy.url}/v1"\nwire_api = "responses"\nenv_key = "PFLASH_API_KEY"\n')
    return {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex"), "PFLASH_API_KEY": "unused"}


def claude_runs(bins: Path, proxy: RecordingProxy, root: Path) -> list[Invocation]:
    home, repo = workspace(root / "claude")
    env = claude_env(home, proxy)
    flags = ["--output-format", "stream-json", "--verbose", "--max-turns", "3", "--allowedTools", "Bash,Read,Glob,LS"]
    claude = str(bins / "claude")
    return [run_client(proxy, "claude", "-p", [claude, "-p", "List the files here, then tell me.", *flags], repo, env),
            run_client(proxy, "claude", "-p --continue",
                       [claude, "-p", "--continue", "And what is in calc.py?", *flags], repo, env)]


def codex_runs(bins: Path, proxy: RecordingProxy, root: Path) -> list[Invocation]:
    home, repo = workspace(root / "codex")
    env = codex_env(home, proxy)
    codex = str(bins / "codex")
    return [run_client(proxy, "codex", "exec", [codex, "exec", "--skip-git-repo-check", "--json",
                                                "List the files here."], repo, env),
            run_client(proxy, "codex", "exec resume --last",
                       [codex, "exec", "--skip-git-repo-check", "--json", "resume", "--last",
                        "And what is in calc.py?"], repo, env)]


def request_kind(exchange: Exchange) -> str:
    """What the client called the request: its headers name sub-agents; the gateway names side ones."""
    h = exchange.headers
    if "x-claude-code-agent-id" in h or "x-openai-subagent" in h:
        return "sub-agent"
    if exchange.branch.startswith("side"):
        return "side"
    return "main" if exchange.method == "POST" else exchange.method


def first_main_reuse(exchanges: list[Exchange], label: str) -> float | None:
    for e in exchanges:
        if e.label == label and e.branch.startswith("main") and e.prompt_tokens:
            return (e.cached_tokens or 0) / e.prompt_tokens
    return None


def run(ctx: BenchContext) -> Section:
    if ctx.model_path is None:
        return Section(TITLE, f"Not run: no model ({ctx.model_error}).")
    bins = install(ctx)
    if isinstance(bins, str):
        return Section(TITLE, f"Not run: {bins}.")
    root = ctx.cache_dir / "clients-run"
    shutil.rmtree(root, ignore_errors=True)
    gateway = GatewayProcess(root / "store", "--model", str(ctx.model_path), "--max-tokens-limit", str(ANSWER_LIMIT),
                             ready_timeout=600)
    proxy = RecordingProxy(gateway.url)
    try:
        invocations: list[Invocation] = []
        for runs in ctx.progress([claude_runs, codex_runs], "clients"):
            invocations += runs(bins, proxy, root)
    finally:
        proxy.close()
        gateway.stop()
    exchanges = proxy.exchanges
    inv_rows = [[i.client, f"`{i.label}`", i.rc, i.ending, f"{i.seconds:.1f}",
                 sum(e.label == f"{i.client} {i.label}" for e in exchanges)] for i in invocations]
    req_rows = [[n + 1, e.label, request_kind(e), e.branch or "–", e.status,
                 "–" if e.prompt_tokens is None else f"{e.prompt_tokens:,}",
                 "–" if e.cached_tokens is None else f"{e.cached_tokens:,}",
                 "–" if not e.prompt_tokens else f"{100 * (e.cached_tokens or 0) / e.prompt_tokens:.1f} %",
                 f"{e.seconds:.1f}"] for n, e in enumerate(exchanges)]
    verdicts = []
    for client, second in (("claude", "-p --continue"), ("codex", "exec resume --last")):
        share = first_main_reuse(exchanges, f"{client} {second}")
        rcs = [i.rc for i in invocations if i.client == client]
        ok = share is not None and share >= GOAL_REUSE and all(rc == 0 for rc in rcs)
        verdicts.append(f"{client}: exit codes {', '.join(map(str, rcs))}; the first main request of `{second}` "
                        f"found {'no' if share is None else f'{100 * share:.1f} %'} of its prompt cached "
                        f"(goal: both invocations exit 0 and ≥ {100 * GOAL_REUSE:.0f} %: "
                        f"{'met' if ok else 'not met'})")
    failures = "".join(f"\n- {i.client} `{i.label}` exited {i.rc}: `{i.tail[-160:]}`" for i in invocations if i.rc)
    text = (
        f"The real binaries, `{CLAUDE}` and `{CODEX}` from npm, installed into `benchmarks/.cache/clients`, run "
        "in a fresh home and a one-file git repository against a gateway serving Gemma 3 270M (the small base "
        "model: its answers are not useful, the traffic is real), answers limited to "
        f"{ANSWER_LIMIT} tokens (`--max-tokens-limit`). Claude Code runs with `DISABLE_AUTOUPDATER=1` and "
        "`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`; Codex with a `pflash` provider (`wire_api = "
        "\"responses\"`). Each client runs a task, then continues it in a second invocation. A recording proxy "
        "between client and gateway logs every request. One run; wall times in seconds.\n\n"
        + md_table(["client", "invocation", "exit code", "how it ended", "wall s", "requests"], inv_rows)
        + "\n" + "\n".join(f"- {v}" for v in verdicts) + (failures and "\n\nFailed invocations:" + failures
                                                          + "\n\n" + BASE_MODEL_NOTE)
        + "\n\nEvery request, in order (kind as the client named it: sub-agents by their headers; side "
        "requests as the gateway classed them; the conversation is the gateway's `X-PFlash-Branch`):\n\n"
        + md_table(["#", "invocation", "kind", "conversation", "status", "prompt tokens", "cached tokens",
                    "cached", "s"], req_rows)
    )
    return Section(TITLE, text)
