"""The status page's JSON through the real engine: per-turn history and strips in
GET /v1/sessions/{id}, the overview, and the static shell's security headers."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from gateway.ui import CSP
from policies.kept_lines import content_hash
from sessions.identity import session_hash
from tests.conftest import Gateway
from tests.metrics_util import scrape, value
from tests.test_compression_e2e import post, python_module, tool_conversation, transcript
from tests.test_recall_e2e import reply_text

pytestmark = pytest.mark.engine

OMITTED = re.compile(r"^\[… lines? (\d+)(?:–(\d+))? omitted …\]$")
RECALL_QUESTION = "What does helper_37 multiply the values by (helper_37)?"


@dataclass(frozen=True)
class RecalledSession:
    """A session whose long tool output was compressed, then partly recalled by a follow-up."""

    name: str  # the client's X-Session-Id
    session_id: str
    output: str  # the original tool output
    served: str  # the compressed message as the model read it

    @property
    def message(self) -> str:
        return content_hash(self.output)

    def kept_from_transcript(self) -> list[list[int]]:
        """Kept ranges (0-based inclusive) read off the served text's omission markers only."""
        n = len(self.output.splitlines())
        omitted = [(int(m.group(1)) - 1, int(m.group(2) or m.group(1)) - 1)
                   for line in self.served.splitlines() if (m := OMITTED.match(line))]
        kept, nxt = [], 0
        for first, last in omitted:
            if first > nxt:
                kept.append([nxt, first - 1])
            nxt = last + 1
        if nxt < n:
            kept.append([nxt, n - 1])
        return kept


def make_recalled_session(server: Gateway, name: str, output: str) -> RecalledSession:
    messages = tool_conversation(output)
    first = post(server, name, messages, max_tokens=4)
    assert first.headers["X-PFlash-Compressed"] == "true"
    follow = [*messages, {"role": "assistant", "content": reply_text(first)},
              {"role": "user", "content": RECALL_QUESTION}]
    second = post(server, name, follow, max_tokens=4)
    assert second.headers["X-PFlash-Recall"] == "true"
    return RecalledSession(name, session_hash("", name), output, transcript(server, name)[3]["content"])


@pytest.fixture(scope="session")
def recalled_session(gateway: Gateway) -> Iterator[RecalledSession]:
    yield make_recalled_session(gateway, "status-" + uuid.uuid4().hex, python_module())


def test_session_json_has_the_turns_and_strips(gateway: Gateway, recalled_session: RecalledSession) -> None:
    rs = recalled_session
    body = httpx.get(f"{gateway.url}/v1/sessions/{rs.name}", timeout=30).json()
    assert body["id"] == rs.session_id and body["client_key"] == rs.name and body["turns"] == 2
    first, second = body["turn_log"]
    lines = rs.output.splitlines()
    kept = rs.kept_from_transcript()
    assert first["compression"]["compressed"] is True and first["compression"]["kept_ranges"] == kept
    assert first["compression"]["lines"] == len(lines) and first["compression"]["message"] == rs.message
    assert first["compression"]["original_tokens"] > first["compression"]["kept_tokens"] > 0
    assert "recall" not in first
    for turn in (first, second):
        assert turn["ttft_ms"] > 0 and turn["prompt_tokens"] == turn["cached_tokens"] + turn["evaluated_tokens"]
    assert second["cached_tokens"] >= first["prompt_tokens"] - 1  # the first turn came from the cache
    recall = second["recall"]
    assert recall["fired"] is True and recall["added_tokens"] > 0
    helper = lines.index("def helper_37(values):")
    assert any(u["message"] == rs.message and u["first"] <= helper <= u["last"] for u in recall["units"])
    assert {u["label"] for u in recall["units"]} == {"the output of read_file(call_read1)"}

    [strip] = body["compressed"]
    assert strip["message"] == rs.message and strip["kept_ranges"] == kept and strip["lines"] == len(lines)
    served = transcript(gateway, rs.name)
    assert strip["served_in"] == 3 and served[3]["content"] == rs.served
    bands = strip["bands"]
    assert bands[0]["first"] == 0 and bands[-1]["last"] == len(lines) - 1
    assert all(a["last"] + 1 == b["first"] for a, b in zip(bands, bands[1:]))
    recalled = [b for b in bands if b["recalled"]]
    assert recalled and any(b["first"] <= helper <= b["last"] for b in recalled)
    for band in bands:  # every band that points into the transcript shows the original lines there
        if band["message"] is None:
            assert band["kind"] == "omitted" and not band["recalled"]
            continue
        shown = served[band["message"]]["content"].split("\n")[band["line"] : band["line"] + band["last"] - band["first"] + 1]
        assert shown == lines[band["first"] : band["last"] + 1]
        assert band["message"] == (3 if band["kind"] == "kept" else len(served) - 1)

    listed = {s["id"]: s for s in httpx.get(gateway.url + "/v1/sessions", timeout=30).json()["data"]}
    assert listed[rs.session_id]["turns"] == 2 and listed[rs.session_id]["client_key"] == rs.name


def test_overview_reads_the_same_numbers_as_metrics(gateway: Gateway, recalled_session: RecalledSession) -> None:
    overview = httpx.get(gateway.url + "/v1/overview", timeout=30).json()
    samples = scrape(gateway.url)
    assert overview["model"] and overview["n_ctx"] == 4096 and overview["engine"] == "llama"
    totals = overview["totals"]
    saved = value(samples, "pflash_compression_tokens_total", direction="in") - value(
        samples, "pflash_compression_tokens_total", direction="out")
    assert totals["saved_by_compression"] == saved > 0
    assert totals["reused_tokens"] == value(samples, "pflash_prefill_tokens_total", kind="reused") > 0
    assert totals["resumes_from_disk"] == value(samples, "pflash_kv_restores_total", tier="disk")
    assert totals["compressions"] >= 1 and totals["recalls"] >= 1
    assert overview["tiers"]["ram"]["budget_bytes"] > 0 and overview["tiers"]["disk"]["budget_bytes"] > 0
    assert overview["queue_depth"] == value(samples, "pflash_queue_depth")


@pytest.mark.parametrize("path", ["/ui", "/ui/", "/ui/ui.js", "/ui/ui.css"])
def test_the_shell_is_static_with_a_strict_policy(gateway: Gateway, path: str) -> None:
    response = httpx.get(gateway.url + path, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == CSP
    assert "script-src 'self';" in CSP and "default-src 'none'" in CSP and "unsafe" not in CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in response.headers
    kind = {"/ui/ui.js": "text/javascript", "/ui/ui.css": "text/css"}.get(path, "text/html")
    assert response.headers["content-type"].startswith(kind)
    if kind == "text/html":  # no inline script or style anywhere in the shell
        assert "<script>" not in response.text and "style=" not in response.text
        assert not re.search(r"\son[a-z]+=", response.text)


@pytest.mark.parametrize("path", ["/ui/missing.js", "/ui/..%2fapp.py", "/ui/index.htm"])
def test_only_the_shipped_files_are_served(gateway: Gateway, path: str) -> None:
    assert httpx.get(gateway.url + path, timeout=30).status_code == 404


def test_turn_log_survives_a_restart_and_counts_the_resume(start_gateway, tmp_path) -> None:  # type: ignore[no-untyped-def]
    name = "restart-ui-" + uuid.uuid4().hex[:8]
    messages = [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "Name a tree."}]
    server = start_gateway(store=tmp_path / "store")
    first = post(server, name, messages, max_tokens=2)
    assert server.stop() == 0

    resumed = start_gateway(store=tmp_path / "store")
    before = httpx.get(f"{resumed.url}/v1/sessions/{name}", timeout=30).json()
    assert before["client_key"] == name and len(before["turn_log"]) == 1  # read back from the store
    follow = [*messages, {"role": "assistant", "content": reply_text(first)}, {"role": "user", "content": "Another?"}]
    post(resumed, name, follow, max_tokens=2)
    after = httpx.get(f"{resumed.url}/v1/sessions/{name}", timeout=30).json()
    assert [t["restored_from"] for t in after["turn_log"]] == ["none", "disk"]
    assert after["turn_log"][1]["cached_tokens"] >= first.json()["usage"]["prompt_tokens"] - 1
    assert httpx.get(resumed.url + "/v1/overview", timeout=30).json()["totals"]["resumes_from_disk"] == 1
