"""The status page in a real browser (Debian's chromium, headless, driven by Playwright) against a
live gateway on the real model: strips match the transcript, content is text, keys isolate tenants.

CI installs chromium (.ci/run); Playwright never downloads a browser of its own here."""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import tenant_of
from sessions.identity import session_hash
from tests.conftest import Gateway
from tests.test_compression_e2e import python_module
from tests.test_status_api_e2e import RecalledSession, make_recalled_session, recalled_session  # noqa: F401

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
NUMBERED = re.compile(r"^\s*(\d+)  (.*)$")

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no chromium at /usr/bin/chromium (apt-get install chromium; "
                                                      ".ci/run installs it)"),
]


class Browser:
    """One fresh headless chromium profile; records dialogs, console errors and uncaught errors."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.page = context.pages[0] if context.pages else context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.page.on("dialog", self._dialog)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append((r.url, r.headers)))

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def bands(self, message: str) -> list[dict[str, Any]]:
        return self.page.eval_on_selector_all(
            f'#strips .strip[data-message="{message}"] .band',
            "els => els.map(e => ({kind: e.dataset.kind, first: +e.dataset.first, last: +e.dataset.last,"
            " recalled: e.dataset.recalled === 'true'}))")

    def show_band(self, message: str, index: int) -> tuple[str, list[tuple[int, str]]]:
        """Click a band; the title and the (line number, text) pairs it shows."""
        self.page.locator(f'#strips .strip[data-message="{message}"] .band').nth(index).click()
        self.page.wait_for_selector("#lines:not([hidden])")
        text = self.page.text_content("#lines-text") or ""
        pairs = [(int(m.group(1)), m.group(2)) for line in text.split("\n") if (m := NUMBERED.match(line))]
        return self.page.text_content("#lines-title") or "", pairs


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 900})
        try:
            yield Browser(context)
        finally:
            context.close()


def open_session(browser: Browser, server: Gateway, session_id: str) -> None:
    page = browser.page
    page.goto(server.url + "/ui")
    row = f'#sessions tbody tr[data-id="{session_id}"]'
    page.wait_for_selector(row)
    page.click(row)
    page.wait_for_selector("#session:not([hidden]) #strips")


def merged(bands: list[dict[str, Any]], kind: str) -> list[list[int]]:
    out: list[list[int]] = []
    for band in bands:
        if band["kind"] != kind:
            continue
        if out and out[-1][1] + 1 == band["first"]:
            out[-1][1] = band["last"]
        else:
            out.append([band["first"], band["last"]])
    return out


def test_strip_matches_the_transcript_and_marks_the_recall(gateway: Gateway, browser: Browser,
                                                           recalled_session: RecalledSession,  # noqa: F811
                                                           tmp_path: Path) -> None:
    started = time.perf_counter()
    rs = recalled_session
    open_session(browser, gateway, rs.session_id)
    page = browser.page
    assert page.text_content("#session-client") == "client id " + rs.name
    assert page.locator("#turns tbody tr").count() == 2
    assert page.locator("#turns td.compressed").count() == 1 and page.locator("#turns td.recalled").count() == 1

    bands = browser.bands(rs.message)
    lines = rs.output.splitlines()
    assert merged(bands, "kept") == rs.kept_from_transcript()  # the strip's kept bands = the served cut
    assert bands[0]["first"] == 0 and bands[-1]["last"] == len(lines) - 1
    helper = lines.index("def helper_37(values):")
    recalled = [i for i, b in enumerate(bands) if b["recalled"]]
    assert any(bands[i]["first"] <= helper <= bands[i]["last"] for i in recalled)
    assert page.locator(".band.recalled").count() == len(recalled)

    # Clicking a band shows its lines as the model read them, numbered as in the original.
    for index in [recalled[0], next(i for i, b in enumerate(bands) if b["kind"] == "kept")]:
        title, shown = browser.show_band(rs.message, index)
        band = bands[index]
        assert [n for n, _ in shown] == list(range(band["first"] + 1, band["last"] + 2)), title
        assert all(lines[n - 1] == text for n, text in shown)
    title, shown = browser.show_band(rs.message, recalled[0])
    assert "recalled" in title
    omitted = next(i for i, b in enumerate(bands) if b["kind"] == "omitted" and not b["recalled"])
    title, shown = browser.show_band(rs.message, omitted)
    assert shown == [] and "never sent to the model" in (page.text_content("#lines-text") or "")

    # Sorting by a header reorders the rows; the open session stays selected.
    page.click('#sessions th[data-sort="tokens"]')
    assert page.locator('#sessions th.sorted[data-sort="tokens"]').count() == 1
    path = tmp_path / "ui.png"
    browser.show_band(rs.message, recalled[0])
    page.screenshot(path=str(path), full_page=True)
    print(f"status page screenshot: {path} ({time.perf_counter() - started:.1f}s in the browser)")
    assert path.stat().st_size > 10_000
    if os.environ.get("PFLASH_UI_SCREENSHOT"):  # how docs/ui.png is made
        shutil.copy(path, os.environ["PFLASH_UI_SCREENSHOT"])
    assert browser.dialogs == [] and browser.errors == []


def test_hostile_content_renders_as_text(gateway: Gateway, browser: Browser) -> None:
    name = "xss-" + uuid.uuid4().hex[:8] + IMG
    module = python_module().replace('"""Sum the invoice lines and apply the tax rate."""',
                                     f'"""Sum the invoice lines. {SCRIPT}"""\n    # {IMG}')
    rs = make_recalled_session(gateway, name, module)
    open_session(browser, gateway, rs.session_id)
    page = browser.page
    assert page.text_content("#session-client") == "client id " + name
    row = page.text_content(f'#sessions tbody tr[data-id="{rs.session_id}"]') or ""
    assert IMG in row
    transcript = page.eval_on_selector_all("#transcript pre", "els => els.map(e => e.textContent)")
    assert any(SCRIPT in text and IMG in text for text in transcript)
    # The kept unit holding the payload shows it verbatim, as text.
    bands = browser.bands(rs.message)
    payload_line = rs.output.splitlines().index(f"    # {IMG}") + 1
    at = next(i for i, b in enumerate(bands) if b["first"] < payload_line <= b["last"] + 1)
    _title, shown = browser.show_band(rs.message, at)
    if bands[at]["kind"] == "kept" or bands[at]["recalled"]:
        assert (payload_line, f"    # {IMG}") in shown
    page.wait_for_timeout(500)  # give any injected handler a chance to fire
    assert page.locator("img").count() == 0
    assert page.eval_on_selector_all("script", "els => els.map(e => e.getAttribute('src'))") == ["/ui/ui.js"]
    assert browser.dialogs == [] and browser.errors == []


def test_keys_keep_tenants_apart_in_the_browser(start_gateway, browser: Browser) -> None:  # type: ignore[no-untyped-def]
    # Waits are on selectors: the page's CSP forbids eval, which Playwright's polled predicates use.
    server = start_gateway("--api-keys", "key-a,key-b,key-c", "--admin-keys", "key-a,key-b")
    name = "a-private-" + uuid.uuid4().hex[:8]
    reply = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                       headers={"Authorization": "Bearer key-a", "X-Session-Id": name},
                       json={"model": "m", "messages": [{"role": "user", "content": "Name a tree."}], "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    a_session = session_hash(tenant_of("key-a"), name)

    assert httpx.get(server.url + "/ui", timeout=30).status_code == 200  # the shell needs no key ...
    assert httpx.get(server.url + "/v1/overview", timeout=30).status_code == 401  # ... its data does
    assert httpx.get(server.url + "/v1/overview", headers={"x-api-key": "key-c"}, timeout=30).status_code == 403

    page = browser.page
    page.goto(server.url + "/ui")
    page.wait_for_selector("#key-form:not([hidden])")
    assert page.is_hidden("#main") and page.locator("#sessions tbody tr").count() == 0

    def sign_in(key: str) -> None:
        page.fill("#key-input", key)
        page.press("#key-input", "Enter")

    sign_in("not-a-key")
    page.wait_for_selector("#key-form:not([hidden])")
    page.wait_for_selector("#status:has-text('refused')")
    sign_in("key-b")
    page.wait_for_selector("#main:not([hidden])")
    page.wait_for_selector("#status:has-text('updated')")
    assert page.locator(f'#sessions tbody tr[data-id="{a_session}"]').count() == 0
    assert name not in (page.content())
    for target in (a_session, name):  # neither by hash nor by the client's name
        page.goto(f"{server.url}/ui#session={target}")
        page.wait_for_selector("#status:has-text('no such session')")
        assert page.is_hidden("#session") and "Name a tree." not in page.content()
        page.evaluate("document.getElementById('status').textContent = ''")
    assert page.evaluate("sessionStorage.getItem('pflash-admin-key')") == "key-b"
    data_requests = [h for url, h in browser.requests if "/v1/" in url]
    assert data_requests and all(h.get("authorization") == "Bearer key-b" for h in data_requests[-3:])
    assert browser.context.cookies() == [] and all("cookie" not in h for _, h in browser.requests)

    page.click("#forget-key")  # the owner, in the same tab, sees its own session
    page.wait_for_selector("#key-form:not([hidden])")
    sign_in("key-a")
    page.wait_for_selector(f'#sessions tbody tr[data-id="{a_session}"]')
    page.click(f'#sessions tbody tr[data-id="{a_session}"]')
    page.wait_for_selector("#session:not([hidden])")
    assert "Name a tree." in (page.text_content("#transcript") or "")
    assert browser.dialogs == []


def test_a_session_shows_its_conversations_and_each_ones_turns(gateway: Gateway, browser: Browser,
                                                                tmp_path: Path) -> None:
    """Claude Code's shape through the real engine: two main turns with a sub-agent turn between
    them, under one session id. The page lists the session once, with its two conversations; the
    sub-agent's row shows its own turn."""
    name = "cc-" + uuid.uuid4().hex[:8]
    agent = "a" + uuid.uuid4().hex[:16]

    def turn(messages: list[dict[str, str]], system: str, extra: dict[str, str] | None = None) -> httpx.Response:
        reply = httpx.post(gateway.url + "/v1/messages", timeout=120, json={
            "model": "m", "max_tokens": 2, "system": system, "messages": messages,
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}]},
            headers={"X-Claude-Code-Session-Id": name, **(extra or {})})
        assert reply.status_code == 200, reply.text
        return reply

    turn([{"role": "user", "content": "List the files."}], "You are the main agent.")
    assert turn([{"role": "user", "content": "ls"}], "You are a sub-agent.",
                {"x-claude-code-agent-id": agent}).headers["X-PFlash-Branch"] == f"agent agent:{agent}"
    turn([{"role": "user", "content": "List the files."}, {"role": "assistant", "content": "calc.py"},
          {"role": "user", "content": "Thanks."}], "You are the main agent.")
    root = session_hash("", name)

    page = browser.page
    page.goto(gateway.url + "/ui")
    page.wait_for_selector(f'#sessions tbody tr[data-id="{root}"]')
    assert "main + 1 agent" in (page.text_content(f'#sessions tbody tr[data-id="{root}"]') or "")
    page.click(f'#sessions tbody tr[data-id="{root}"]')
    page.wait_for_selector("#session:not([hidden]) #branches tbody tr")
    rows = page.eval_on_selector_all("#branches tbody tr", "els => els.map(e => [e.dataset.kind, e.textContent])")
    assert [kind for kind, _ in rows] == ["main", "agent"] and agent in rows[1][1]
    assert page.locator("#turns tbody tr").count() == 2  # the main agent's two turns
    page.click('#branches tbody tr[data-kind="agent"]')
    page.wait_for_selector("#turns-of:has-text('agent')")
    assert page.locator("#turns tbody tr").count() == 1
    assert "ls" in (page.text_content("#transcript") or "")
    page.screenshot(path=str(tmp_path / "conversations.png"), full_page=True)
    assert browser.dialogs == [] and browser.errors == []
