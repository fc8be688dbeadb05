// The status page: reads the admin JSON endpoints with the key typed once (sessionStorage) and draws
// the overview, the sessions and one session's turns and strips. Every text from the server is
// inserted with textContent: transcripts hold arbitrary file contents.
"use strict";

(() => {
  const KEY = "pflash-admin-key";
  const REFRESH_MS = 3000;
  const $ = (id) => document.getElementById(id);
  const state = { sessions: [], sort: { key: "last_used", desc: true }, open: null, branch: null, shown: "",
    transcript: [] };
  let timer = null;

  // --- small helpers ------------------------------------------------------------------------------
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  const num = (n) => (n === undefined || n === null ? "–" : Number(n).toLocaleString("en"));
  function bytes(n) {
    if (!n) return "0 B";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
    return (n / 1024 ** i).toFixed(i ? 1 : 0) + " " + units[i];
  }
  function ago(seconds) {
    if (!seconds) return "–";
    const s = Math.max(0, Math.round(Date.now() / 1000 - seconds));
    if (s < 120) return s + " s ago";
    if (s < 7200) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }
  const span = (first, last) => (first === last ? "line " + (first + 1) : "lines " + (first + 1) + "–" + (last + 1));
  const say = (text) => { $("status").textContent = text; };

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = "Bearer " + key;
    const response = await fetch(path, { headers, credentials: "omit", cache: "no-store" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      throw new HttpError(response.status, (body.error && body.error.message) || response.statusText);
    }
    return body;
  }

  // --- key ------------------------------------------------------------------------------------------
  function askForKey(message) {
    clearInterval(timer);
    timer = null;
    $("main").hidden = true;
    $("key-form").hidden = false;
    say(message);
    $("key-input").focus();
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key-input").value.trim();
    $("key-input").value = "";
    if (key) sessionStorage.setItem(KEY, key);
    start();
  });

  $("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    askForKey("key forgotten");
  });

  // --- overview -------------------------------------------------------------------------------------
  function card(title, value, detail) {
    const box = el("div", "card");
    box.append(el("div", "card-title", title), el("div", "card-value", value));
    if (detail) box.append(el("div", "card-detail", detail));
    return box;
  }

  function renderOverview(o) {
    const t = o.totals, ram = o.tiers.ram, disk = o.tiers.disk;
    $("overview").replaceChildren(
      card("model", o.model, o.engine + " engine · scorer " + o.scorer),
      card("context", num(o.n_ctx) + " tokens", o.tiers.context.sessions ? "1 session loaded" : "empty"),
      card("RAM tier", bytes(ram.used_bytes) + " / " + bytes(ram.budget_bytes), num(ram.sessions) + " sessions"),
      card("disk tier", bytes(disk.used_bytes) + " / " + bytes(disk.budget_bytes), num(disk.sessions) + " sessions"),
      card("queue", num(o.queue_depth), "turns queued or running"),
      card("tokens served", num(t.prompt_tokens) + " in", num(t.completion_tokens) + " out"),
      card("reused from cache", num(t.reused_tokens), num(t.evaluated_tokens) + " evaluated"),
      card("saved by compression", num(t.saved_by_compression),
        num(t.compressions) + " compressions · " + num(t.recalls) + " recalls"),
      card("resumes from disk", num(t.resumes_from_disk), num(t.resumes_from_ram) + " from RAM"),
      card("from checkpoints", num(t.checkpoint_tokens_reused), num(t.checkpoint_hits) + " turns started from one"),
    );
    renderCheckpoints(o.checkpoints);
  }

  function renderCheckpoints(c) {
    $("checkpoints-box").hidden = !c;
    if (!c) return;
    $("checkpoints").tBodies[0].replaceChildren(...c.list.map((k) => {
      const tr = el("tr"), name = el("td");
      name.append(el("code", "", k.key));
      tr.append(name, el("td", "", k.origin), el("td", "num", num(k.tokens)),
        el("td", "num", num(k.hits)), el("td", "", k.tier), el("td", "num", bytes(k.ram_bytes || k.disk_bytes)),
        el("td", "num", new Date(k.last_used * 1000).toLocaleTimeString("en-GB")));
      return tr;
    }));
  }

  // --- sessions table -------------------------------------------------------------------------------
  // "main + 2 agent + 1 side": the conversations under one session id, by kind.
  function conversations(row) {
    const counts = {};
    for (const b of row.branches || []) counts[b.kind] = (counts[b.kind] || 0) + 1;
    return ["main", "agent", "side", "fork"].filter((k) => counts[k])
      .map((k) => (k === "main" && counts[k] === 1 ? k : counts[k] + " " + k)).join(" + ");
  }
  const sortValue = (row, key) => (key === "kv_bytes" ? row.ram_bytes || row.disk_bytes
    : key === "conversations" ? (row.branches || []).length : row[key]);

  function renderSessions() {
    const { key, desc } = state.sort;
    const rows = [...state.sessions].sort((a, b) => {
      const x = sortValue(a, key) ?? "", y = sortValue(b, key) ?? "";
      return (x < y ? -1 : x > y ? 1 : 0) * (desc ? -1 : 1);
    });
    const body = $("sessions").tBodies[0];
    body.replaceChildren(...rows.map((row) => {
      const tr = el("tr", row.id === state.open ? "selected" : "");
      tr.dataset.id = row.id;
      tr.append(
        el("td", "mono", row.id.slice(0, 12)), el("td", "", row.client_key ?? ""), el("td", "tier-" + row.tier, row.tier),
        el("td", "num", num(row.tokens)), el("td", "num", bytes(sortValue(row, "kv_bytes"))),
        el("td", "num", ago(row.last_used)), el("td", "num", row.turns ?? "–"), el("td", "", conversations(row)),
      );
      tr.addEventListener("click", () => { location.hash = "session=" + row.id; });
      return tr;
    }));
    if (!rows.length) {
      const tr = el("tr", "empty");
      tr.append(el("td", "", "no sessions yet"));
      body.append(tr);
    }
    for (const th of $("sessions").tHead.rows[0].cells) {
      th.classList.toggle("sorted", th.dataset.sort === key);
      th.classList.toggle("desc", th.dataset.sort === key && desc);
    }
  }

  for (const th of document.querySelectorAll("#sessions th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.sort = { key, desc: state.sort.key === key ? !state.sort.desc : true };
      renderSessions();
    });
  }

  // --- one session ----------------------------------------------------------------------------------
  const branchName = (b) => b.kind + (b.hint ? " " + b.hint.replace(/^(agent|thread):/, "") : "");

  function renderBranches(branches, showing) {
    $("branches").tBodies[0].replaceChildren(...branches.map((b) => {
      const tr = el("tr", b.id === showing ? "selected" : "");
      tr.dataset.id = b.id;
      tr.dataset.kind = b.kind;
      tr.append(
        el("td", "", branchName(b)), el("td", "tier-" + b.tier, b.tier), el("td", "num", num(b.tokens)),
        el("td", "num", bytes(b.ram_bytes || b.disk_bytes)), el("td", "num", b.turns ?? "–"),
        el("td", "num", ago(b.last_used)),
      );
      tr.addEventListener("click", () => { state.branch = b.id; state.shown = ""; loadSession(state.open); });
      return tr;
    }));
  }

  function compressionText(c) {
    if (!c) return "";
    if (!c.compressed) return "served whole (" + c.reason + ")";
    const kept = c.kept_ranges.map(([a, b]) => span(a, b)).join(", ");
    return num(c.original_tokens) + " → " + num(c.kept_tokens) + " tokens served · " + c.scorer + " "
      + c.scorer_ms + " ms · kept " + kept;
  }

  function recallText(r) {
    if (!r) return "";
    if (!r.fired) return "not fired (" + r.reason + ")";
    const merged = [];
    for (const u of r.units) { // adjacent units of one message read as one excerpt
      const prev = merged[merged.length - 1];
      if (prev && prev.message === u.message && prev.last + 1 === u.first) prev.last = u.last;
      else merged.push({ ...u });
    }
    const units = merged.map((u) => span(u.first, u.last) + " of " + u.label).join("; ");
    return "+" + num(r.added_tokens) + " tokens · " + units;
  }

  function renderTurns(turns) {
    $("turns").tBodies[0].replaceChildren(...turns.map((t, i) => {
      const tr = el("tr");
      tr.append(
        el("td", "num", i + 1), el("td", "num", num(t.prompt_tokens)), el("td", "num", num(t.cached_tokens)),
        el("td", "num", num(t.evaluated_tokens)), el("td", "num", num(t.completion_tokens)),
        el("td", "num", t.ttft_ms), el("td", "", (t.restored_from ?? "")
          + (t.checkpoint_tokens ? " (" + num(t.checkpoint_tokens) + " from a checkpoint)" : "")),
        el("td", t.compression && t.compression.compressed ? "compressed" : "", compressionText(t.compression)),
        el("td", t.recall && t.recall.fired ? "recalled" : "", recallText(t.recall)),
      );
      return tr;
    }));
  }

  function bandTitle(band) {
    const n = band.last - band.first + 1;
    if (band.kind === "kept") return span(band.first, band.last) + " kept";
    return n + (n === 1 ? " line" : " lines") + " omitted" + (band.recalled ? ", recalled" : "");
  }

  function renderStrip(message) {
    const figure = el("figure", "strip-box");
    const caption = el("figcaption", "", message.label);
    const kept = message.kept_ranges.reduce((n, [a, b]) => n + b - a + 1, 0);
    caption.append(el("div", "muted", num(kept) + " of " + num(message.lines) + " lines kept, holding "
      + num(message.kept_tokens) + " of " + num(message.original_tokens) + " tokens"));
    const strip = el("div", "strip");
    strip.dataset.message = message.message;
    for (const band of message.bands) {
      const node = el("button", "band " + band.kind + (band.recalled ? " recalled" : ""), bandTitle(band));
      node.type = "button";
      node.title = span(band.first, band.last);
      node.style.flexGrow = String(band.last - band.first + 1);
      Object.assign(node.dataset, { kind: band.kind, first: band.first, last: band.last,
        recalled: band.recalled ? "true" : "false" });
      node.addEventListener("click", () => showLines(band));
      strip.append(node);
    }
    figure.append(caption, strip);
    return figure;
  }

  function showLines(band) {
    const n = band.last - band.first + 1;
    let title = span(band.first, band.last) + (band.kind === "kept" ? ", kept" : ", omitted");
    let text;
    if (band.message === null || band.message === undefined || !state.transcript[band.message]) {
      title += band.recalled ? ", recalled (that turn is no longer in the last prompt)" : "";
      text = n + " lines were never sent to the model; the gateway keeps only a hash of the original.";
    } else {
      title += band.recalled && band.kind !== "kept" ? ", recalled: as the model read it in message "
        + (band.message + 1) : ": as the model read it in message " + (band.message + 1);
      const lines = state.transcript[band.message].content.split("\n").slice(band.line, band.line + n);
      const width = String(band.last + 1).length;
      text = lines.map((line, i) => String(band.first + 1 + i).padStart(width) + "  " + line.replace(/\r$/, ""))
        .join("\n");
    }
    $("lines-title").textContent = title;
    $("lines-text").textContent = text;
    $("lines").hidden = false;
  }

  function renderTranscript(messages) {
    $("transcript").replaceChildren(...messages.map((m, i) => {
      const details = el("details", "message");
      const lines = m.content.split("\n").length;
      details.append(el("summary", "", (i + 1) + ". " + (m.role === "user" && m.kind === "tool_output" ? "user (tool output)"
          : m.role === "user" && m.kind === "harness" ? "user (harness message)" : m.role)
        + " · " + num(lines) + (lines === 1 ? " line" : " lines")),
        el("pre", "", m.content));
      return details;
    }));
  }

  async function loadSession(id) {
    const root = await api("/v1/sessions/" + encodeURIComponent(id));
    const branches = root.branches || [];
    const showing = branches.some((b) => b.id === state.branch) ? state.branch : root.id;
    const [session, transcript] = await Promise.all([
      showing === root.id ? root : api("/v1/sessions/" + showing),
      api("/v1/sessions/" + encodeURIComponent(showing) + "/transcript"),
    ]);
    const shown = JSON.stringify([showing, branches, session.turn_log, session.compressed, transcript.messages.length]);
    if (shown === state.shown) return; // unchanged: keep the open band and scroll position
    state.shown = shown;
    state.transcript = transcript.messages;
    $("session-id").textContent = root.id.slice(0, 16);
    $("session-client").textContent = root.client_key ? "client id " + root.client_key : "";
    renderBranches(branches, showing);
    const branch = branches.find((b) => b.id === showing);
    $("turns-of").textContent = branch ? "of " + branchName(branch) : "";
    renderTurns(session.turn_log);
    $("strips").replaceChildren(...session.compressed.map(renderStrip));
    if (!session.compressed.length) $("strips").append(el("p", "muted", "nothing compressed in this session"));
    renderTranscript(transcript.messages);
    $("lines").hidden = true;
    $("session").hidden = false;
  }

  async function openFromHash() {
    const match = /^#session=([0-9A-Za-z._:-]+)$/.exec(location.hash);
    state.open = match ? match[1] : null;
    state.branch = null;
    state.shown = "";
    $("session").hidden = true;
    renderSessions();
    if (!state.open) return;
    try {
      await loadSession(state.open);
    } catch (err) {
      report(err, "session " + state.open.slice(0, 12));
    }
  }

  window.addEventListener("hashchange", openFromHash);

  // --- refresh loop ---------------------------------------------------------------------------------
  function report(err, what) {
    if (err.status === 401) {
      const refused = sessionStorage.getItem(KEY) !== null;
      sessionStorage.removeItem(KEY);
      askForKey(refused ? "this key was refused: type an admin key" : "this gateway needs an admin key");
    }
    else if (err.status === 403) askForKey("this key has no admin role: type an admin key");
    else if (err.status === 404) say(what + ": no such session for this key");
    else say(what + ": " + err.message);
  }

  async function refresh() {
    try {
      const [overview, sessions] = await Promise.all([api("/v1/overview"), api("/v1/sessions")]);
      renderOverview(overview);
      state.sessions = sessions.data;
      renderSessions();
      say("updated " + new Date().toLocaleTimeString("en-GB"));
    } catch (err) {
      report(err, "refresh");
      return false;
    }
    if (state.open) {
      try { await loadSession(state.open); } catch (err) { report(err, "session " + state.open.slice(0, 12)); }
    }
    return true;
  }

  async function start() {
    $("key-form").hidden = true;
    say("loading…");
    if (!(await refresh())) return;
    $("main").hidden = false;
    $("forget-key").hidden = !sessionStorage.getItem(KEY);
    await openFromHash();
    if (!timer) timer = setInterval(refresh, REFRESH_MS);
  }

  start(); // without a stored key the first request tells whether the gateway needs one
})();
