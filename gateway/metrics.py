"""Prometheus metrics at `GET /metrics` (prometheus-client, one CollectorRegistry per app).

Two kinds of metric live here:

- events only the HTTP layer sees (requests by API and status, total latency, time to first
  token) are recorded as they happen, by a middleware and by `note_first_output`;
- everything the engine, the session registry, the store and the turn service already count in
  their `stats()`/`counters` dicts is read at scrape time by `StatsCollector`, so no number is
  kept twice and the dicts stay the single source of truth.

Labels never carry client input (paths are mapped to a fixed API name), so cardinality is bounded
and the endpoint carries no session data: it is served without auth.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gateway.loop_probe import lag_probe_ctx
from gateway.state import APP_STATE, AppState
from gateway.ui import is_ui_path

log = logging.getLogger("pflash.metrics")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Per-request keys (aiohttp request mapping).
_STARTED: web.RequestKey[float] = web.RequestKey("pflash_metrics_started", float)
_API: web.RequestKey[str] = web.RequestKey("pflash_metrics_api", str)
_FIRST_OUTPUT: web.RequestKey[bool] = web.RequestKey("pflash_metrics_first_output", bool)

_ROUTE_API = {
    "/v1/chat/completions": "openai",
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/models": "models",
    "/health": "health",
    "/metrics": "metrics",
}

# Seconds. Short cached turns land in the first buckets, long cold prefills (CPU) in the last.
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def api_label(path: str) -> str:
    """A fixed API name for a path: never the raw path (ids in paths would explode cardinality)."""
    if path in _ROUTE_API:
        return _ROUTE_API[path]
    if path in ("/v1/sessions", "/v1/overview") or path.startswith("/v1/sessions/"):
        return "admin"
    if is_ui_path(path):
        return "ui"
    return "other"


class GatewayMetrics:
    """The app's registry, its event metrics, and the scrape-time collector over the stats dicts."""

    def __init__(self, state: Callable[[], AppState | None]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("pflash_requests", "HTTP requests by API and response status.",
                                ["api", "status"], registry=self.registry)
        self.latency = Histogram("pflash_request_duration_seconds",
                                 "Time from request arrival to the last byte of the response, by API.",
                                 ["api"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("pflash_time_to_first_token_seconds",
                              "Time from request arrival to the first generated text or tool-call event, by API "
                              "(parsing, queueing, compression scoring and prefill included).",
                              ["api"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.loop_lag = Histogram("pflash_event_loop_lag_seconds",
                                  "How late a 10 ms timer on the event loop fired: time the loop was blocked.",
                                  buckets=_LAG_BUCKETS, registry=self.registry)
        self.registry.register(StatsCollector(state))
        ProcessCollector(registry=self.registry)  # RSS, CPU, fds: what "memory bounded" is judged on

    # --- recording -------------------------------------------------------------------------------
    def middleware(self) -> Any:
        @web.middleware
        async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            api = api_label(request.path)
            request[_STARTED] = time.perf_counter()
            request[_API] = api
            status = "500"
            try:
                response = await handler(request)
                status = str(response.status)
                return response
            except web.HTTPException as exc:
                status = str(exc.status)
                raise
            except asyncio.CancelledError:
                status = "499"  # the client went away (nginx's convention)
                raise
            finally:
                self.requests.labels(api, status).inc()
                self.latency.labels(api).observe(time.perf_counter() - request[_STARTED])

        return metrics_middleware

    def first_output(self, request: web.Request) -> None:
        if request.get(_FIRST_OUTPUT) or _STARTED not in request:
            return
        request[_FIRST_OUTPUT] = True
        self.ttft.labels(request[_API]).observe(time.perf_counter() - request[_STARTED])

    # --- exposition ------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.Response:
        # Off the event loop: the session registry's lock can be held by a store write.
        body = await asyncio.to_thread(generate_latest, self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


METRICS: web.AppKey[GatewayMetrics] = web.AppKey("pflash_metrics", GatewayMetrics)


def install(app: web.Application) -> GatewayMetrics:
    """The app's metrics: the `/metrics` route, and a middleware put outermost so that it sees
    every request's final status (401s from auth, errors rendered by the error middleware)."""
    metrics = GatewayMetrics(lambda: app.get(APP_STATE))
    app[METRICS] = metrics
    app.middlewares.insert(0, metrics.middleware())
    app.router.add_get("/metrics", metrics.handle)
    app.cleanup_ctx.append(lag_probe_ctx(metrics.loop_lag.observe))
    return metrics


def note_first_output(request: web.Request) -> None:
    """Time to first token: call where a text or tool-call event is first written (idempotent)."""
    metrics = request.app.get(METRICS)
    if metrics is not None:
        metrics.first_output(request)


class StatsCollector(Collector):
    """Reads the live stats dicts at scrape time (engine, registry + store, turn service)."""

    def __init__(self, state: Callable[[], AppState | None]) -> None:
        self._state = state

    def describe(self) -> list[Metric]:
        return []  # dynamic: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        if state is None:  # still loading the model
            return
        stats = snapshot(state)
        yield from _engine_metrics(stats)
        yield from _session_metrics(stats.sessions)
        yield from _checkpoint_metrics(stats)
        yield from _turn_metrics(stats.turns, scorer_name(state))


@dataclass(frozen=True)
class StatsSnapshot:
    """The numbers of the engine, the session registry (+ store) and the turn service, read once."""

    engine: dict[str, float]
    sessions: dict[str, float]
    turns: dict[str, float]

    def prefill_tokens(self, kind: str) -> float:
        """`kind` "evaluated" or "reused": the engine counts every job; engines without the key
        fall back to the turn service's count."""
        key = f"prefill_tokens_{kind}"
        return self.engine.get(key, self.turns.get(key, 0.0))


def snapshot(state: AppState) -> StatsSnapshot:
    """Blocking (the registry's lock can be held by a store write): call it off the event loop."""
    stats = getattr(state.engine, "stats", None)
    sessions = {**state.registry.stats(), **(state.checkpoints.stats() if state.checkpoints is not None else {})}
    return StatsSnapshot(_numbers(stats() if callable(stats) else {}), _numbers(sessions), _numbers(state.turns.stats()))


def _numbers(stats: Mapping[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in stats.items() if isinstance(v, (int, float))}


def scorer_name(state: AppState) -> str:
    return state.turns.compressor.scorers.name if state.turns is not None else state.settings.scorer


def _counter(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value, labels=labels)


def _engine_metrics(stats: StatsSnapshot) -> Iterator[Metric]:
    engine = stats.engine
    prefill = _counter("pflash_prefill_tokens", "Prompt tokens prefilled (evaluated) or reused from the KV cache.",
                       labels=["kind"])
    for kind in ("evaluated", "reused"):
        prefill.add_metric([kind], stats.prefill_tokens(kind))
    yield prefill
    if "completion_tokens" in engine:
        yield _counter("pflash_completion_tokens", "Tokens generated.", engine["completion_tokens"])
    if "repetition_stops" in engine:
        yield _counter("pflash_repetition_stops", "Answers ended because they looped (repeated_line_stop "
                       "repeats), whatever the rule.", engine["repetition_stops"])
        loops = _counter("pflash_loop_stops", "Answers ended in a loop, by rule: one line repeated (line), lines "
                         "that vary a little (near), a phrase looping in one unbroken line (phrase).", labels=["rule"])
        for rule in ("line", "near", "phrase"):
            loops.add_metric([rule], engine.get(f"repetition_stops_{rule}", 0.0))
        yield loops
    restores = _counter("pflash_kv_restores", "Session KV states restored into the context, by tier.", labels=["tier"])
    for tier in ("ram", "disk"):
        restores.add_metric([tier], engine.get(f"restores_{tier}", 0.0))
    yield restores
    yield _counter("pflash_kv_restore_failures",
                   "Saved KV states the engine could not restore (served by full prefill).",
                   engine.get("restore_failures", 0.0))
    yield _counter("pflash_prefix_reuse_refused",
                   "Turns whose cached prefix was not reused: the prompt diverged further back than the "
                   "sliding-window cache allows (after a restore, a restore that saved no prefill).",
                   engine.get("prefix_reuse_refused", 0.0))
    yield GaugeMetricFamily("pflash_queue_depth", "Turns queued or running in the engine.",
                            value=engine.get("queue_depth", 0.0))
    if "upstream_requests" in engine:  # upstream mode
        upstream = _counter("pflash_upstream_events", "Upstream requests, errors, connect retries, requests "
                            "re-sent with response_format in the llama.cpp form, requests sent with the tool-call "
                            "grammar, and answers whose calls came back as text.", labels=["event"])
        for event in ("requests", "errors", "retries", "format_fallbacks", "grammar_requests", "text_calls"):
            upstream.add_metric([event], engine.get(f"upstream_{event}", 0.0))
        yield upstream


def _checkpoint_metrics(stats: StatsSnapshot) -> Iterator[Metric]:
    """Prefix checkpoints: what new sessions, sub-agents and side requests start from."""
    engine, s = stats.engine, stats.sessions
    if "checkpoint_hits" not in engine:
        return
    turns = _counter("pflash_checkpoint_turns", "Turns that started from a shared prefix checkpoint (hit), and "
                     "turns that found nothing to reuse at all (miss: a cold prefill).", labels=["result"])
    turns.add_metric(["hit"], engine["checkpoint_hits"])
    turns.add_metric(["miss"], engine.get("checkpoint_misses", 0.0))
    yield turns
    yield _counter("pflash_checkpoint_tokens_reused", "Prompt tokens a prefix checkpoint spared a prefill.",
                   engine.get("checkpoint_tokens_reused", 0.0))
    yield _counter("pflash_checkpoints_saved", "Prefix checkpoints saved while prefilling.",
                   engine.get("checkpoints_saved", 0.0))
    yield _counter("pflash_states_persisted", "Session KV states written to disk while idle after a turn (crash "
                   "resume).", engine.get("states_persisted", 0.0))
    held = GaugeMetricFamily("pflash_checkpoints", "Prefix checkpoints held, by tier.", labels=["tier"])
    size = GaugeMetricFamily("pflash_checkpoint_bytes", "Bytes of prefix checkpoints held, by tier.", labels=["tier"])
    for tier in ("ram", "disk"):
        held.add_metric([tier], s.get(f"checkpoints_{tier}", 0.0))
        size.add_metric([tier], s.get(f"checkpoint_{tier}_bytes", 0.0))
    yield held
    yield size
    evictions = _counter("pflash_checkpoint_evictions", "Prefix checkpoints leaving a tier for its budget (RAM: "
                         "spilled to disk; disk: deleted), or replaced by the same session's newer prompt.",
                         labels=["tier"])
    evictions.add_metric(["ram"], s.get("checkpoint_evicted_ram", 0.0))
    evictions.add_metric(["disk"], s.get("checkpoint_evicted_disk", 0.0))
    evictions.add_metric(["superseded"], s.get("checkpoint_superseded", 0.0))
    yield evictions


def _session_metrics(s: dict[str, float]) -> Iterator[Metric]:
    count = GaugeMetricFamily("pflash_sessions", "Sessions with a KV state, by tier (context, RAM, disk).",
                              labels=["tier"])
    for tier in ("context", "ram", "disk"):
        count.add_metric([tier], s.get(f"sessions_{tier}", 0.0))
    yield count
    size = GaugeMetricFamily("pflash_session_bytes", "Bytes of session state held, by tier.", labels=["tier"])
    size.add_metric(["ram"], s.get("ram_bytes", 0.0))
    size.add_metric(["disk"], s.get("disk_bytes", 0.0))
    yield size
    yield GaugeMetricFamily("pflash_session_records", "Session records held in memory (the rest live in the store).",
                            value=s.get("sessions_records", 0.0))
    yield GaugeMetricFamily("pflash_session_record_bytes", "Approximate bytes of the session records held in memory "
                            "(counted in the RAM budget with the KV states).", value=s.get("record_bytes", 0.0))
    yield _counter("pflash_session_spills", "KV states moved from RAM to disk for the RAM budget.", s.get("spills", 0.0))
    side = _counter("pflash_side_states", "KV states of side requests put in the RAM tier (at its least recently "
                    "used end, so they leave first) and spilled from it.", labels=["event"])
    side.add_metric(["stashed"], s.get("side_states_stashed", 0.0))
    side.add_metric(["spilled"], s.get("side_states_spilled", 0.0))
    yield side
    yield GaugeMetricFamily("pflash_state_buffer_bytes", "Bytes of the reused buffers that KV states are saved and "
                            "loaded into (at most two, outside the RAM budget while free).",
                            value=s.get("state_buffer_bytes", 0.0))
    buffers = _counter("pflash_state_buffers", "State buffers handed out, by whether one was reused or allocated "
                       "(fresh memory costs a first touch).", labels=["kind"])
    for kind in ("reused", "allocated"):
        buffers.add_metric([kind], s.get(f"state_buffers_{kind}", 0.0))
    yield buffers
    yield _counter("pflash_session_records_evicted",
                   "Session records dropped from memory for the RAM budget (a changed one is written first; it is "
                   "read back from the store on its next turn).", s.get("records_evicted", 0.0))
    writes = _counter("pflash_store_writes", "Files written to the store, by kind: session records (written ahead, "
                      "each turn) and KV states (spills and shutdown).", labels=["kind"])
    written = _counter("pflash_store_written_bytes", "Bytes written to the store (zstd-compressed for KV states), "
                       "by kind.", labels=["kind"])
    writes.add_metric(["record"], s.get("store_record_writes", 0.0))
    writes.add_metric(["kv"], s.get("store_writes", 0.0))
    written.add_metric(["record"], s.get("store_record_bytes_written", 0.0))
    written.add_metric(["kv"], s.get("store_kv_bytes_written", 0.0))
    yield writes
    yield written
    yield _counter("pflash_store_syncs", "Batched fsyncs of records written ahead without their own (record_sync "
                   "\"batched\").", s.get("store_syncs", 0.0))
    yield _counter("pflash_store_reads", "Session records or KV states read from the store.", s.get("store_reads", 0.0))
    failures = _counter("pflash_store_failures",
                        "Store failures: write (disk full, read-only), read (KV failed its checksum or could not "
                        "be decoded: full prefill), discard (metadata invalid or stale), sync (a batched fsync "
                        "failed: the files are in place, not yet durable).", labels=["op"])
    failures.add_metric(["write"], s.get("store_errors", 0.0))
    failures.add_metric(["read"], s.get("store_failures", 0.0))
    failures.add_metric(["discard"], s.get("store_discarded", 0.0))
    failures.add_metric(["sync"], s.get("store_sync_failures", 0.0))
    yield failures
    yield _counter("pflash_store_evictions", "Stored sessions evicted for the disk budget.", s.get("store_evicted", 0.0))
    yield _counter("pflash_store_leftovers_removed", "Leftovers of interrupted writes (temp files, session directories "
                   "without a record) removed when the store opened: what a crash left behind.",
                   s.get("store_leftovers_removed", 0.0))


def _turn_metrics(t: dict[str, float], scorer: str) -> Iterator[Metric]:
    by_outcome: dict[tuple[str, str], float] = {("compressed", ""): 0.0}  # the family shows before traffic
    for key, value in t.items():
        name, _, reason = key.partition(":")  # "compression_fallbacks:<reason>" (TurnService convention)
        if name == "compressions":
            by_outcome[("compressed", reason)] = by_outcome.get(("compressed", reason), 0.0) + value
        elif name == "compression_fallbacks":
            label = ("fallback", reason or "unknown")
            by_outcome[label] = by_outcome.get(label, 0.0) + value
    events = _counter("pflash_compression_events",
                      "New long messages considered for compression: compressed, or served whole (fallback) "
                      "with the reason.", labels=["scorer", "outcome", "reason"])
    for (outcome, reason), value in by_outcome.items():
        events.add_metric([scorer, outcome, reason], value)
    yield events
    tokens = _counter("pflash_compression_tokens",
                      "Tokens of messages considered for compression (in) and as served (out).", labels=["direction"])
    tokens.add_metric(["in"], t.get("compression_tokens_in", 0.0))
    tokens.add_metric(["out"], t.get("compression_tokens_out", 0.0))
    yield tokens
    seconds = _counter("pflash_scorer_seconds", "Seconds spent scoring units (drafter or lexical), by phase.",
                       labels=["scorer", "phase"])
    seconds.add_metric([scorer, "compression"], t.get("scorer_seconds", 0.0))
    seconds.add_metric([scorer, "recall"], t.get("recall_seconds", 0.0))
    yield seconds
    yield _counter("pflash_scorer_failures", "Scorer failures (the message was served whole).",
                   t.get("scorer_failures", 0.0))
    yield _counter("pflash_scorer_fallbacks",
                   "The configured scorer did not load at start and a simpler one serves instead (see the log).",
                   t.get("scorer_fallbacks", 0.0))
    recall = _counter("pflash_recall_events", "Follow-up questions checked by the recall gate, by outcome.",
                      labels=["outcome"])
    recall.add_metric(["fired"], t.get("recalls", 0.0))
    recall.add_metric(["not_fired"], t.get("recall_checks", 0.0))
    recall.add_metric(["failed"], t.get("recall_failures", 0.0))
    yield recall
    yield _counter("pflash_kept_map_failures", "Kept-line maps that did not re-apply (message served whole).",
                   t.get("kept_map_failures", 0.0))
    yield _counter("pflash_gate_embedder_fallbacks",
                   "The ranker's sentence encoder did not load at start: the ranker ranks by words alone and its "
                   "recall gate uses BM25.", t.get("gate_embedder_fallbacks", 0.0))
    yield _counter("pflash_ranker_meaning_failures",
                   "Messages the ranker ranked by words alone because the sentence encoder failed on them (see the log).",
                   t.get("meaning_failures", 0.0))
    gate = _counter("pflash_recall_gate_scoring",
                    "Recall gate checks by how they were scored: the sentence encoder (units embedded by compression "
                    "or after their turn) or BM25 (the units not embedded yet, or no encoder).", labels=["scorer"])
    gate.add_metric(["embed"], t.get("gate_embedded", 0.0))
    gate.add_metric(["bm25"], t.get("gate_lexical", 0.0))
    yield gate
    yield _counter("pflash_background_embedded_units",
                   "Units of compressed messages embedded after their turn, while the engine was idle.",
                   t.get("background_units_embedded", 0.0))
    yield _counter("pflash_background_embedding_jobs", "Background embedding jobs finished (one per compression).",
                   t.get("background_jobs", 0.0))
    yield _counter("pflash_background_embedding_seconds", "Wall time of background embedding jobs.",
                   t.get("background_seconds", 0.0))
    yield _counter("pflash_background_embedding_failures", "Background embedding jobs that failed (BM25 at the gate).",
                   t.get("background_failures", 0.0))
    yield _counter("pflash_background_embedding_dropped", "Background embedding jobs dropped while waiting, the "
                   "oldest first, to keep the queue bounded (BM25 at the gate for their messages).",
                   t.get("background_dropped", 0.0))
    yield GaugeMetricFamily("pflash_background_embedding_pending", "Background embedding jobs queued or running.",
                            value=t.get("background_pending", 0.0))
    yield from _branch_metrics(t)


BRANCH_KINDS = ("main", "agent", "side", "fork")


def _branch_metrics(t: dict[str, float]) -> Iterator[Metric]:
    """Conversations inside sessions (gateway/branches.py): counters keyed "<name>:<kind>"."""
    for name, doc in (
        ("branch_turns", "Turns by the kind of conversation they continued: the session's main agent, a sub-agent "
         "(agent id), a side request (title, safety classifier) or another conversation under the same id (fork)."),
        ("branches_opened", "Conversations opened inside sessions, by kind."),
        ("branch_prefix_lost", "Turns that carried their conversation's whole last request yet found less of its "
         "prompt cached (re-prefilled: its state was lost or pushed out by another conversation), by kind."),
    ):
        family = _counter(f"pflash_{name}", doc, labels=["kind"])
        for kind in BRANCH_KINDS:
            family.add_metric([kind], t.get(f"{name}:{kind}", 0.0))
        yield family
    yield _counter("pflash_branches_dropped", "Idle conversations dropped to keep a session within its branch limit.",
                   t.get("branches_dropped", 0.0))
    yield _counter("pflash_side_requests", "Side requests (no tools, a schema-shaped answer or an agent session's "
                   "one-shot prompt): served on their own branch, their state the first to leave RAM.",
                   t.get("side_requests", 0.0))

