"""API keys and tenant isolation, with real HTTP requests against a live gateway.

The gateway runs with `--api-keys k1,k2 --admin-keys adm,adm2`: two ordinary tenants and two admin
tenants (the second admin proves that the admin role does not cross tenants either).
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.app import tenant_of
from sessions.identity import session_hash
from tests.conftest import ROOT, Gateway
from tests.metrics_util import scrape, value

pytestmark = pytest.mark.engine

SYSTEM = "You are a careful assistant that reviews Python code and explains what it does. " * 6


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Gateway]:
    server = Gateway(tmp_path_factory.mktemp("auth") / "store", model_path,
                     "--api-keys", "k1,k2", "--admin-keys", "adm,adm2", "--n-threads", "1")
    yield server
    server.stop()


def bearer(key: str, session: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["X-Session-Id"] = session
    return headers


def chat(server: Gateway, headers: dict[str, str], messages: list[dict[str, Any]], max_tokens: int = 4) -> httpx.Response:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def cached(reply: httpx.Response) -> int:
    return int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


TURN_ENDPOINTS: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, "openai"),
    ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 1}, "openai"),
    ("/v1/messages", {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}, "anthropic"),
    ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "anthropic"),
]


def assert_error_shape(response: httpx.Response, status: int, kind: str, shape: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    else:
        assert set(body) == {"error"} and body["error"]["type"] == kind and body["error"]["message"]


@pytest.mark.parametrize(("path", "body", "shape"), TURN_ENDPOINTS, ids=[e[0] for e in TURN_ENDPOINTS])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"x-api-key": "k1x"}, {"Authorization": "k1"}],
                         ids=["none", "wrong-bearer", "wrong-x-api-key", "no-bearer-prefix"])
def test_missing_or_wrong_key_is_401_in_the_api_shape(secured: Gateway, path: str, body: dict[str, Any],
                                                      shape: str, headers: dict[str, str]) -> None:
    response = httpx.post(secured.url + path, json=body, headers=headers, timeout=30)
    assert_error_shape(response, 401, "authentication_error", shape)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/v1/sessions"),
                                              ("GET", "/v1/sessions/x/transcript"), ("DELETE", "/v1/sessions/x")])
def test_other_endpoints_need_a_key_too(secured: Gateway, method: str, path: str) -> None:
    assert_error_shape(httpx.request(method, secured.url + path, timeout=30), 401, "authentication_error", "openai")


def test_health_and_metrics_are_open(secured: Gateway) -> None:
    assert httpx.get(secured.url + "/health", timeout=30).status_code == 200
    before = value(scrape(secured.url), "pflash_requests_total", api="openai", status="401")  # no key needed
    refused = httpx.post(secured.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=30)
    assert refused.status_code == 401
    after = value(scrape(secured.url), "pflash_requests_total", api="openai", status="401")
    assert after == before + 1  # counted, and /metrics carries counts only


def test_bearer_and_x_api_key_both_work_with_the_official_sdks(secured: Gateway) -> None:
    session = "sdk-" + uuid.uuid4().hex
    oa = openai.OpenAI(base_url=secured.url + "/v1", api_key="k1", max_retries=0,  # sends Authorization: Bearer
                       default_headers={"X-Session-Id": session})
    reply = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name a color."}],
                                       max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    an = anthropic.Anthropic(base_url=secured.url, api_key="k2", max_retries=0)  # sends x-api-key
    message = an.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "Name a fruit."}],
                                 extra_body={"temperature": 0})
    assert message.stop_reason in ("end_turn", "max_tokens")
    raw = httpx.post(secured.url + "/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 1},
                     headers={"x-api-key": "adm"}, timeout=60)
    assert raw.status_code == 200, raw.text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=secured.url + "/v1", api_key="k3", max_retries=0).models.list()


def test_a_tenant_cannot_resume_another_tenants_session(secured: Gateway) -> None:
    """k2 sends k1's exact conversation under k1's X-Session-Id: it gets its own, cold session."""
    shared = "shared-" + uuid.uuid4().hex
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What does `len([])` return?"}]
    one = chat(secured, bearer("k1", shared), first)
    assert one.status_code == 200, one.text
    second = [*first, {"role": "assistant", "content": one.json()["choices"][0]["message"]["content"] or ""},
              {"role": "user", "content": "And `len('ab')`?"}]

    intruder = chat(secured, {"x-api-key": "k2", "X-Session-Id": shared}, second)
    assert intruder.status_code == 200, intruder.text
    assert cached(intruder) == 0  # nothing of k1's KV was reused
    assert intruder.headers["X-PFlash-Restored-From"] == "none"
    assert intruder.headers["X-PFlash-Session"] != one.headers["X-PFlash-Session"]

    owner = chat(secured, bearer("k1", shared), second)  # k1's own history is intact afterwards
    assert owner.status_code == 200, owner.text
    assert cached(owner) >= int(one.json()["usage"]["prompt_tokens"]) - 1
    # Its KV stayed in its own sequence of the batched engine (the single-sequence engine restores it
    # from the RAM tier after the intruder's turn).
    assert owner.headers["X-PFlash-Restored-From"] in {"context", "ram"}


def test_previous_response_id_is_scoped_by_key(secured: Gateway) -> None:
    made = httpx.post(secured.url + "/v1/responses", json={"model": "m", "input": "Say hi.", "max_output_tokens": 2},
                      headers=bearer("k1"), timeout=60)
    assert made.status_code == 200, made.text
    follow = {"model": "m", "input": "Again.", "max_output_tokens": 1, "previous_response_id": made.json()["id"]}
    stolen = httpx.post(secured.url + "/v1/responses", json=follow, headers=bearer("k2"), timeout=60)
    assert_error_shape(stolen, 400, "invalid_request_error", "openai")
    assert stolen.json()["error"]["code"] == "previous_response_not_found"
    assert httpx.post(secured.url + "/v1/responses", json=follow, headers=bearer("k1"), timeout=60).status_code == 200


ADMIN_CALLS = [("GET", "/v1/sessions"), ("GET", "/v1/sessions/{id}"), ("GET", "/v1/sessions/{id}/transcript"),
               ("DELETE", "/v1/sessions/{id}")]


@pytest.mark.parametrize(("method", "path"), ADMIN_CALLS)
def test_session_admin_endpoints_need_the_admin_role(secured: Gateway, method: str, path: str) -> None:
    session = "mine-" + uuid.uuid4().hex
    assert chat(secured, bearer("k1", session), [{"role": "user", "content": "hi"}], 1).status_code == 200
    for headers in (bearer("k1"), {"x-api-key": "k2"}):  # not even for one's own session
        response = httpx.request(method, secured.url + path.format(id=session), headers=headers, timeout=30)
        assert_error_shape(response, 403, "permission_error", "openai")


def test_admin_keys_see_only_their_own_tenant(secured: Gateway) -> None:
    """The admin role unlocks the session endpoints; it does not cross tenants (see the README)."""
    own = "adm-" + uuid.uuid4().hex
    other = "k1-" + uuid.uuid4().hex
    assert chat(secured, bearer("adm", own), [{"role": "user", "content": "Name a tree."}]).status_code == 200
    assert chat(secured, bearer("k1", other), [{"role": "user", "content": "Name a river."}]).status_code == 200
    own_hash = session_hash(tenant_of("adm"), own)
    k1_hash = session_hash(tenant_of("k1"), other)

    listed = httpx.get(secured.url + "/v1/sessions", headers=bearer("adm"), timeout=30)
    assert listed.status_code == 200
    ids = {s["id"] for s in listed.json()["data"]}
    assert own_hash in ids and k1_hash not in ids
    assert all("tenant" not in s for s in listed.json()["data"])
    transcript = httpx.get(f"{secured.url}/v1/sessions/{own}/transcript", headers=bearer("adm"), timeout=30)
    assert transcript.status_code == 200 and "Name a tree." in transcript.text

    # Neither another admin, nor an admin reaching for k1's session by name or by full hash.
    for key, name in [("adm2", own), ("adm2", own_hash), ("adm", other), ("adm", k1_hash)]:
        for method, path in ADMIN_CALLS[1:]:
            response = httpx.request(method, secured.url + path.format(id=name), headers=bearer(key), timeout=30)
            assert_error_shape(response, 404, "not_found_error", "openai")
    others = httpx.get(secured.url + "/v1/sessions", headers={"x-api-key": "adm2"}, timeout=30).json()["data"]
    assert own_hash not in {s["id"] for s in others} and k1_hash not in {s["id"] for s in others}

    # Both sessions survived every attempt; the owner can still delete its own.
    again = httpx.get(f"{secured.url}/v1/sessions/{own_hash}", headers=bearer("adm"), timeout=30)
    assert again.status_code == 200 and again.json()["id"] == own_hash
    gone = httpx.delete(f"{secured.url}/v1/sessions/{own}", headers=bearer("adm"), timeout=30)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert httpx.get(f"{secured.url}/v1/sessions/{own}", headers=bearer("adm"), timeout=30).status_code == 404
    follow = chat(secured, bearer("k1", other), [{"role": "user", "content": "Name a river."},
                                                 {"role": "assistant", "content": "Nile"},
                                                 {"role": "user", "content": "Another?"}])
    assert follow.status_code == 200 and cached(follow) > 0  # k1's session was never touched


def test_401s_are_counted_in_metrics(secured: Gateway) -> None:
    before = value(scrape(secured.url), "pflash_requests_total", api="anthropic", status="401")
    httpx.post(secured.url + "/v1/messages", json={}, timeout=30)
    after = value(scrape(secured.url), "pflash_requests_total", api="anthropic", status="401")
    assert after == before + 1


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_remote_bind_without_keys_is_refused_with_one_line(tmp_path: Path, host: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--host", host, "--store-dir", str(tmp_path / "s")],
        cwd=ROOT, check=False, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "refusing to listen" in lines[0] and "--api-keys" in lines[0]
    assert not (tmp_path / "s").exists()  # refused before anything was created
