// onceflow console: plain JavaScript, no dependencies. Every value from the
// API is put into the page with textContent, never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "onceflow.console.token";
  const ACTOR_KEY = "onceflow.console.actor";
  const REFRESH_MS = 5000;

  const $ = (id) => document.getElementById(id);
  let timer = null;
  let filter = {};
  let returnFocus = null;

  // ---- API -------------------------------------------------------------

  class APIError extends Error {
    constructor(status, body) {
      super((body && body.error) || "HTTP " + status);
      this.status = status;
      this.body = body;
    }
  }

  // Paths are relative to the page, so the console also works behind a
  // proxy that serves it under a prefix.
  async function api(path, body) {
    const headers = { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) };
    const actor = sessionStorage.getItem(ACTOR_KEY);
    if (actor) headers["X-Onceflow-Actor"] = actor;
    const init = { headers, cache: "no-store" };
    if (body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    if (res.status === 401) {
      signOut("The token was refused. Sign in again.");
      throw new APIError(401, data);
    }
    if (!res.ok) throw new APIError(res.status, data);
    return data;
  }

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
    const s = q.toString();
    return s ? "?" + s : "";
  }

  // Request ids: random, from crypto.getRandomValues (also on plain http).
  function newRequestID() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    return "web-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  }

  // ---- small DOM helpers ------------------------------------------------

  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("data-") || k.startsWith("aria-") || k === "title" || k === "datetime" || k === "type") e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  function fmtTime(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    const s = Math.round((Date.now() - d.getTime()) / 1000);
    let rel;
    if (Math.abs(s) < 60) rel = s >= 0 ? s + " s ago" : "in " + -s + " s";
    else if (Math.abs(s) < 3600) rel = s >= 0 ? Math.round(s / 60) + " min ago" : "in " + Math.round(-s / 60) + " min";
    else if (Math.abs(s) < 86400) rel = s >= 0 ? Math.round(s / 3600) + " h ago" : "in " + Math.round(-s / 3600) + " h";
    else rel = d.toISOString().slice(0, 16).replace("T", " ") + " UTC";
    return el("time", { datetime: iso, title: d.toISOString(), text: rel });
  }

  function fmtAge(seconds) {
    if (seconds < 60) return Math.round(seconds) + " s";
    if (seconds < 3600) return Math.round(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function badge(kind, text) {
    return el("span", { class: "badge " + kind, text: text || kind.replace("_", " ") });
  }

  function fillBody(table, rows, emptyText, cols) {
    const tbody = $(table).tBodies[0];
    tbody.replaceChildren();
    if (rows.length === 0) {
      tbody.append(el("tr", { class: "empty" }, el("td", { colSpan: cols, text: emptyText })));
      return;
    }
    for (const r of rows) tbody.append(r);
  }

  function say(msg, bad) {
    const s = $("status");
    s.textContent = msg || "";
    s.classList.toggle("bad", !!bad);
  }

  // ---- sign in and out ----------------------------------------------------

  async function signIn(ev) {
    ev.preventDefault();
    const token = $("token").value.trim();
    $("login-error").textContent = "";
    if (!token) {
      $("login-error").textContent = "Enter the admin token.";
      $("token").focus();
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    const actor = $("actor").value.trim();
    if (actor) sessionStorage.setItem(ACTOR_KEY, actor); else sessionStorage.removeItem(ACTOR_KEY);
    try {
      await start();
    } catch (e) {
      if (e.status !== 401) $("login-error").textContent = "Could not reach the console: " + e.message;
    }
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    stopTimer();
    $("console").hidden = true;
    $("controls").hidden = true;
    $("who").textContent = "";
    $("login").hidden = false;
    $("token").value = "";
    $("login-error").textContent = message || "";
    say("");
    $("token").focus();
  }

  async function start() {
    const s = await api("api/v1/session");
    $("token").value = "";
    $("login").hidden = true;
    $("console").hidden = false;
    $("controls").hidden = false;
    $("who").textContent = "consumer " + s.consumer + (s.group ? " · group " + s.group : "") +
      " · signed in as " + s.actor + " (" + s.via + ")";
    await refresh();
    schedule();
    // Runbooks link to a panel: /#gaps, /#dead-letters, /#lag, /#relay.
    const target = location.hash && document.getElementById(location.hash.slice(1));
    if (target && target.closest("#console")) {
      target.scrollIntoView();
      const h = target.querySelector("h2");
      if (h) { h.tabIndex = -1; h.focus(); }
    } else if (document.activeElement === document.body || document.activeElement === $("token")) {
      $("main").focus();
    }
  }

  // ---- refresh --------------------------------------------------------------

  function dialogOpen() {
    return $("replay-dialog").open || $("resolve-dialog").open;
  }

  function stopTimer() {
    if (timer) clearTimeout(timer);
    timer = null;
  }

  function schedule() {
    stopTimer();
    if (!$("auto").checked) return;
    timer = setTimeout(async () => {
      if (!dialogOpen() && !document.hidden) await refresh();
      schedule();
    }, REFRESH_MS);
  }

  async function refresh() {
    const parts = [
      ["summary", "api/v1/summary", renderSummary],
      ["gaps", "api/v1/gaps", renderGaps],
      ["groups", "api/v1/dead-letters/groups" + query(filter), renderGroups],
      ["held", "api/v1/held", renderHeld],
      ["held effects", "api/v1/effects/held", renderHeldEffects],
      ["lag", "api/v1/lag", renderLag],
      ["relay", "api/v1/relay", renderRelay],
      ["audit", "api/v1/audit", renderAudit],
      ["reconcile", "api/v1/reconcile", renderReconcile],
    ];
    const results = await Promise.allSettled(parts.map(([, path]) => api(path)));
    const failed = [];
    results.forEach((r, i) => {
      if (r.status === "fulfilled") parts[i][2](r.value);
      else if (r.reason.status !== 401) failed.push(parts[i][0] + ": " + r.reason.message);
    });
    if (!sessionStorage.getItem(TOKEN_KEY)) return;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    if (failed.length) say("Some panels could not be loaded — " + failed.join("; "), true);
    else if ($("status").classList.contains("bad")) say("");
  }

  // ---- panels -----------------------------------------------------------------

  function renderSummary(s) {
    const card = (label, value, level) =>
      el("div", { class: level || "" }, el("dt", { text: label }), el("dd", { text: String(value) }));
    $("summary-list").replaceChildren(
      card("Open gaps", s.open_gaps, s.open_gaps > 0 ? "warn" : "ok"),
      card("Given up, unresolved", s.given_up_unresolved, s.given_up_unresolved > 0 ? "bad" : "ok"),
      card("Dead letters", s.dead, s.dead > 0 ? "bad" : "ok"),
      card("Held", s.held, s.held > 0 ? "warn" : "ok"),
      card("Parked", s.parked, ""),
      card("Cleanup held back",
        s.cleanup_holder ? fmtAge(s.cleanup_held_seconds) + " (" + s.cleanup_holder + ")" : "no",
        s.cleanup_held_seconds > 1800 ? "warn" : "ok"),
    );
  }

  // A gap's stream in words: its source, and for a producer's stream (not a
  // legacy one) the producer and topic.
  function streamName(g) {
    return "source " + g.source + (g.producer ? " (producer " + g.producer + ", topic " + g.topic + ")" : "");
  }

  function renderGaps(data) {
    const rows = data.gaps.map((g) => {
      const range = g.from === g.to ? String(g.from) : g.from + "–" + g.to;
      const state = g.state === "given_up" ? badge("given_up", "given up" + (g.reason ? " (" + g.reason.replace("_", " ") + ")" : "")) : badge(g.state);
      let resolution = "–";
      let action = null;
      if (g.state === "open" && g.give_up_by) {
        resolution = el("span", { class: "muted", text: "give-up asked by " + g.give_up_by });
      } else if (g.state === "open") {
        action = el("button", { type: "button", class: "small", text: "Give up now…",
          "aria-label": "Give up gap " + range + " of " + streamName(g) + " now" });
        action.addEventListener("click", () => openResolve(g, action, "give-up"));
      }
      if (g.state === "given_up") {
        if (g.resolved_at) {
          resolution = el("span", {}, badge("resolved"), " ", g.resolved_note || "");
        } else {
          resolution = el("span", { class: "muted", text: "not resolved" });
          action = el("button", { type: "button", class: "small", text: "Resolve…",
            "aria-label": "Resolve gap " + range + " of " + streamName(g) });
          action.addEventListener("click", () => openResolve(g, action, "resolve"));
        }
      }
      const stream = g.producer
        ? el("td", { class: "mono" }, g.source, el("span", { class: "sample", text: "producer " + g.producer + " · topic " + g.topic }))
        : el("td", { class: "mono", text: g.source });
      return el("tr", { "data-gap-id": String(g.id), "data-source": g.source, "data-producer": g.producer || "",
        "data-topic": g.topic || "", "data-state": g.state },
        stream,
        el("td", { class: "mono", text: range }),
        el("td", {}, state),
        el("td", {}, fmtTime(g.opened_at)),
        el("td", {}, g.state === "open" ? fmtTime(g.deadline) : fmtTime(g.closed_at)),
        el("td", {}, resolution),
        el("td", {}, action));
    });
    fillBody("gaps-table", rows, "No open gaps, and none given up in the last 24 hours.", 7);
  }

  function renderGroups(data) {
    const rows = data.groups.map((g) => {
      const key = g.key || (g.status === "held" ? "(late events kept for an operator)" : "(no error recorded)");
      const btn = el("button", { type: "button", class: "small replay-group", text: "Replay…", "data-group-id": g.id,
        "aria-label": "Replay " + g.count + " " + g.status + " events of the group: " + key });
      btn.addEventListener("click", () => openReplay(g, btn));
      const sample = g.sample && g.sample !== g.key ? el("span", { class: "sample", text: "e.g. " + g.sample }) : null;
      return el("tr", { "data-group-id": g.id, "data-count": String(g.count) },
        el("td", { class: "key" }, el("span", { class: "mono", text: key }), sample),
        el("td", {}, badge(g.status)),
        el("td", { class: "num", text: String(g.count) }),
        el("td", { class: "num", text: String(g.sources) }),
        el("td", { class: "mono", text: (g.event_types || []).join(", ") }),
        el("td", {}, fmtTime(g.first_received_at)),
        el("td", {}, fmtTime(g.last_received_at)),
        el("td", {}, btn));
    });
    fillBody("groups-table", rows, Object.keys(filter).length ? "No dead letters match the filter." : "No dead letters.", 8);
  }

  function renderHeld(data) {
    const rows = data.held.map((d) => {
      const btn = el("button", { type: "button", class: "small", text: "Replay…", "aria-label": "Replay held event " + d.event_id });
      btn.addEventListener("click", () => openReplay({ event_id: d.event_id, count: 1, key: "held event " + d.event_id }, btn));
      return el("tr", {},
        el("td", { class: "mono", text: d.event_id }),
        el("td", { class: "mono", text: d.source }),
        el("td", { class: "num", text: d.seq === null ? "–" : String(d.seq) }),
        el("td", { class: "mono", text: d.event_type }),
        el("td", {}, fmtTime(d.received_at)),
        el("td", {}, btn));
    });
    fillBody("held-table", rows, "No held events.", 6);
  }

  function renderHeldEffects(data) {
    const rows = data.effects.map((f) =>
      el("tr", {},
        el("td", { class: "mono", text: f.scope }),
        el("td", { class: "mono", text: f.key }),
        el("td", { class: "mono", text: f.event_id || "–" }),
        el("td", { class: "num", text: String(f.attempts) }),
        el("td", {}, fmtTime(f.held_at)),
        el("td", { text: f.reason })));
    fillBody("held-effects-table", rows, "No held effects.", 6);
  }

  function renderLag(rep) {
    const n = (v) => (v === null || v === undefined ? "–" : String(v));
    const rows = rep.partitions.map((p) => el("tr", {},
      el("td", { class: "mono", text: p.topic }),
      el("td", { class: "num", text: String(p.partition) }),
      el("td", { class: "num", text: n(p.end_offset) }),
      el("td", { class: "num", text: n(p.stored_next_offset) }),
      el("td", { class: "num", text: n(p.kafka_committed) }),
      el("td", { class: "num", text: n(p.lag) })));
    fillBody("lag-table", rows, "No partitions known yet.", 6);
    $("lag-note").hidden = !rep.kafka_error;
    $("lag-note").textContent = rep.kafka_error ? "Kafka: " + rep.kafka_error : "";
  }

  function renderRelay(st) {
    const live = st.leases.find((l) => l.live);
    const items = [];
    const pair = (k, v) => items.push(el("dt", { text: k }), el("dd", {}, v));
    if (live) {
      const left = Math.max(0, (new Date(live.expires_at) - new Date(st.db_time)) / 1000);
      pair("Leader", el("span", {}, badge("ok", "leading"), " ", el("span", { class: "mono", text: live.holder })));
      pair("Lease", "shard " + live.shard + (live.shards > 1 ? " of " + live.shards : "") + ", epoch " + live.epoch + ", renewed " + fmtAge(Math.max(0, (new Date(st.db_time) - new Date(live.renewed_at)) / 1000)) +
        " ago, expires in " + fmtAge(left));
      if (live.shards > 1) {
        const led = st.leases.filter((l) => l.live && l.shards === live.shards).length;
        pair("Shards led", el("span", {}, badge(led === live.shards ? "ok" : "error", led + " of " + live.shards),
          led === live.shards ? "" : " a shard without a leader publishes nothing (runbook RelayShardWithoutLeader)"));
      }
    } else {
      pair("Leader", el("span", {}, badge("error", "none"), " no relay holds a live lease (runbook RelayNoLeader)"));
    }
    pair("Pending rows", String(st.pending_rows));
    pair("Oldest unpublished", st.oldest_unpublished_at ? fmtAge(st.oldest_unpublished_age_seconds) + " old" : "–");
    const sa = st.set_aside || { count: 0, rows: [] };
    pair("Set aside", sa.count > 0
      ? el("span", {}, badge("error", String(sa.count)), sa.count === 1 ? " row waits (its source is held back)" : " rows wait (their sources are held back)")
      : "0");
    $("relay-list").replaceChildren(...items);
    const rows = (sa.rows || []).map((r) => {
      const reason = r.reason + (r.retry_at ? " (retried by the relay)" : "");
      return el("tr", { "data-outbox-id": String(r.outbox_id), "data-source": r.source },
        el("td", { class: "num mono", text: String(r.outbox_id) }),
        el("td", { class: "mono", text: r.source }),
        el("td", { class: "num mono", text: String(r.seq) }),
        el("td", { class: "mono", text: r.topic }),
        el("td", {}, badge("error", reason)),
        el("td", { class: "mono", text: r.error, title: r.error }),
        el("td", {}, fmtTime(r.set_aside_at)));
    });
    const more = sa.count > rows.length ? " (the oldest " + rows.length + " of " + sa.count + ")" : "";
    $("set-aside-h").textContent = "Set-aside outbox rows" + more;
    fillBody("set-aside-table", rows, "No outbox rows set aside.", 7);
  }

  function renderReconcile(data) {
    const run = data.last;
    const pair = (k, v) => [el("dt", { text: k }), el("dd", {}, v)];
    if (!run) {
      $("reconcile-list").replaceChildren(...pair("Last run", "none recorded (run consumer reconcile)"));
      fillBody("reconcile-table", [], "No run recorded.", 5);
      return;
    }
    const rep = run.report || {};
    const c = rep.counts || {};
    const w = rep.window || {};
    $("reconcile-list").replaceChildren(
      ...pair("Outcome", badge(run.status === "clean" ? "ok" : "error", run.status === "clean" ? "clean" : run.anomalies + " anomalies")),
      ...pair("Finished", fmtTime(run.finished_at)),
      ...pair("Window", w.from_id ? "outbox ids " + w.from_id + " to " + (w.to_id || "end") : fmtTime(w.from) + " to " + fmtTime(w.until)),
      ...pair("Topics", (run.topics || []).join(", ")),
      ...pair("Read", (c.committed || 0) + " outbox rows, " + (c.records || 0) + " records, " + (c.applied || 0) + " applied, " +
        (c.streams || 0) + " streams"),
    );
    const rows = (rep.findings || []).map((f) => el("tr", {},
      el("td", {}, badge(f.resolved ? "resolved" : "error", f.kind.replaceAll("_", " ") + (f.resolved ? " (resolved)" : ""))),
      el("td", { class: "mono", text: streamName(f) }),
      el("td", { class: "mono", text: (f.seqs || []).map((r) => r.from === r.to ? String(r.from) : r.from + "–" + r.to).join(", ") }),
      el("td", { class: "num", text: String(f.count) }),
      el("td", { text: f.detail || "" })));
    fillBody("reconcile-table", rows, "No findings: every event committed in the window was published once, in order, and applied once.", 5);
  }

  function renderAudit(data) {
    const rows = data.audit.map((a) => {
      const p = a.params || {};
      let what = a.action;
      if (a.action === "dlq.replay") {
        const r = a.result || {};
        const target = p.event_id ? "event " + p.event_id : p.all ? "all" : Object.entries(p.filter || {}).map(([k, v]) => k + "=" + v).join(" ");
        what = "replay " + target + " — " + (r.replayed || 0) + " replayed, " + (r.replayed_late || 0) + " late, " +
          (r.failed || 0) + " failed" + (r.skipped ? ", " + r.skipped + " skipped" : "");
      } else if (a.action === "gap.resolve") {
        what = "resolve gap " + p.source + " " + p.from + "–" + p.to;
      } else if (a.action === "gap.give_up") {
        what = "give up gap " + p.source + " " + p.from + "–" + p.to + " now";
      }
      return el("tr", {},
        el("td", {}, fmtTime(a.created_at)),
        el("td", { text: a.actor + " (" + a.via + ")" }),
        el("td", { text: what }),
        el("td", {}, badge(a.outcome)),
        el("td", { text: a.note }));
    });
    fillBody("audit-table", rows, "No changes yet.", 5);
  }

  // ---- replay dialog ------------------------------------------------------------

  let replay = null; // { request, count }

  async function openReplay(g, opener) {
    returnFocus = opener;
    const body = g.event_id ? { event_id: g.event_id } : { filter: Object.assign({}, filter, { group: g.id }) };
    replay = { body, requestID: newRequestID(), count: null, done: false };
    $("replay-what").textContent = g.event_id ? "Held event " + g.event_id + "." :
      "Error group " + g.id + " (" + g.status + "): " + (g.key || "(no error recorded)");
    $("replay-count").textContent = "Counting…";
    $("replay-note").value = "";
    $("replay-note").disabled = false;
    $("replay-error").textContent = "";
    $("replay-result").textContent = "";
    $("replay-result").classList.remove("bad");
    $("replay-confirm").hidden = false;
    $("replay-confirm").disabled = true;
    $("replay-confirm").textContent = "Replay";
    $("replay-cancel").textContent = "Cancel";
    $("replay-dialog").showModal();
    await countReplay();
  }

  async function countReplay() {
    const cur = replay;
    try {
      const r = await api("api/v1/dead-letters/replay", Object.assign({ dry_run: true }, cur.body));
      if (cur !== replay) return; // the dialog was closed meanwhile
      cur.count = r.matched;
      if (r.matched === 0) {
        $("replay-count").textContent = "Nothing matches any more: it was replayed already or has changed.";
        return;
      }
      $("replay-count").textContent = r.matched + " event" + (r.matched === 1 ? "" : "s") + " of " + r.sources + " source" +
        (r.sources === 1 ? "" : "s") + " will be replayed, each source in seq order" +
        (r.remaining ? " (" + r.attempted + " now, " + r.remaining + " beyond the limit)" : "") + ".";
      const fx = effectsSummary(r.events || []);
      if (fx) $("replay-count").textContent += " " + fx;
      $("replay-confirm").textContent = "Replay " + r.matched + " event" + (r.matched === 1 ? "" : "s");
      $("replay-confirm").disabled = false;
    } catch (e) {
      if (cur !== replay) return;
      $("replay-count").textContent = "";
      $("replay-error").textContent = "Could not count the events: " + e.message;
    }
  }

  // effectsSummary counts the dry run's effect verdicts (the events it
  // lists): what the replay would send, answer from the ledger, or hold.
  function effectsSummary(events) {
    const n = {};
    let listed = 0;
    events.forEach((e) => (e.effects || []).forEach((f) => { n[f.verdict] = (n[f.verdict] || 0) + 1; listed++; }));
    if (!listed) return "";
    const parts = Object.keys(n).sort().map((v) => n[v] + " " + v);
    return "External effects of the " + events.length + " event" + (events.length === 1 ? "" : "s") + " listed: " + parts.join(", ") +
      " (held ones fail the replay until resolved; `consumer dlq replay -dry-run` lists each).";
  }

  async function confirmReplay(ev) {
    ev.preventDefault();
    const cur = replay;
    if (!cur || cur.done || cur.busy || cur.count === null) return;
    const note = $("replay-note").value.trim();
    if (!note) {
      $("replay-error").textContent = "Say why you replay (the fix that was made): the note goes into the audit.";
      $("replay-note").focus();
      return;
    }
    $("replay-error").textContent = "";
    $("replay-confirm").disabled = true;
    $("replay-confirm").textContent = "Replaying…";
    const body = Object.assign({ request_id: cur.requestID, note }, cur.body);
    if (!cur.body.event_id) body.expect = cur.count;
    cur.busy = true;
    try {
      const r = await api("api/v1/dead-letters/replay", body);
      cur.busy = false;
      cur.done = true;
      const parts = [r.replayed + " replayed", r.replayed_late + " replayed late"];
      if (r.parked) parts.push(r.parked + " parked behind a gap");
      if (r.already_processed) parts.push(r.already_processed + " already processed");
      if (r.failed) parts.push(r.failed + " failed");
      if (r.skipped) parts.push(r.skipped + " skipped");
      const res = $("replay-result");
      res.textContent = "Done (audit #" + r.audit_id + "): " + parts.join(", ") + "." +
        (r.failed ? " First failure: " + (r.events.find((e) => e.result === "failed") || {}).error : "");
      res.classList.toggle("bad", r.failed > 0);
      $("replay-confirm").hidden = true;
      $("replay-note").disabled = true;
      $("replay-cancel").textContent = "Close";
      $("replay-cancel").focus();
      refresh();
    } catch (e) {
      cur.busy = false;
      if (e.status === 409 && e.body && e.body.error_kind === "count_changed") {
        // The set changed since the count: show the new count, ask again.
        cur.requestID = newRequestID();
        $("replay-error").textContent = e.message;
        await countReplay();
      } else {
        // Same request id on a retry: the server applies it at most once.
        $("replay-error").textContent = "Replay failed: " + e.message + " — you can retry safely.";
        $("replay-confirm").disabled = false;
        $("replay-confirm").textContent = "Retry";
      }
    }
  }

  // ---- resolve dialog --------------------------------------------------------------

  let resolve = null;

  // The dialog serves two audited changes: a note on a given-up gap
  // (resolve) and giving an open gap up now (give-up).
  const GAP_MODES = {
    "resolve": { title: "Resolve a given-up gap", label: "What was done about the missing events (required)",
      button: "Resolve", path: "api/v1/gaps/resolve", empty: "Say what was done about the missing events.",
      what: (g) => ", given up " + new Date(g.closed_at).toISOString() + ".",
      done: (g) => "Gap " + g.source + " " + g.from + "–" + g.to + " resolved." },
    "give-up": { title: "Give an open gap up now", label: "Why the missing events will not come (required)",
      button: "Give up now", path: "api/v1/gaps/give-up", empty: "Say why the missing events will not come.",
      what: (g) => ", deadline " + new Date(g.deadline).toISOString() +
        ". The consumer gives it up (and every open gap of the stream below it) within a few seconds and applies the events parked behind it.",
      done: (g) => "Gap " + g.source + " " + g.from + "–" + g.to + ": give-up requested." },
  };

  function openResolve(g, opener, mode) {
    returnFocus = opener;
    const m = GAP_MODES[mode];
    resolve = { gap: g, requestID: newRequestID(), mode: m };
    $("resolve-h").textContent = m.title;
    $("resolve-label").textContent = m.label;
    $("resolve-confirm").textContent = m.button;
    $("resolve-what").textContent = "Stream: " + streamName(g) + ", missing seqs " + g.from + "–" + g.to + m.what(g);
    $("resolve-note").value = "";
    $("resolve-error").textContent = "";
    $("resolve-confirm").disabled = false;
    $("resolve-dialog").showModal();
  }

  async function confirmResolve(ev) {
    ev.preventDefault();
    const m = resolve.mode;
    const note = $("resolve-note").value.trim();
    if (!note) {
      $("resolve-error").textContent = m.empty;
      $("resolve-note").focus();
      return;
    }
    $("resolve-confirm").disabled = true;
    const g = resolve.gap;
    try {
      await api(m.path, { request_id: resolve.requestID, source: g.source, producer: g.producer || "", topic: g.topic || "",
        from: g.from, to: g.to, note });
      $("resolve-dialog").close();
      say(m.done(g));
      refresh();
    } catch (e) {
      $("resolve-error").textContent = "Could not " + m.button.toLowerCase() + ": " + e.message;
      $("resolve-confirm").disabled = false;
    }
  }

  function afterDialog() {
    const target = returnFocus && returnFocus.isConnected ? returnFocus : null;
    returnFocus = null;
    if (target) target.focus(); else $("dl-h").focus();
    schedule();
  }

  // ---- wiring ----------------------------------------------------------------------

  function readFilter(ev) {
    if (ev) ev.preventDefault();
    const f = {};
    for (const [k, v] of new FormData($("filter-form")).entries()) if (String(v).trim()) f[k] = String(v).trim();
    filter = f;
    refresh();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", signIn);
    $("signout").addEventListener("click", () => signOut("Signed out."));
    $("refresh").addEventListener("click", () => refresh());
    $("auto").addEventListener("change", schedule);
    $("filter-form").addEventListener("submit", readFilter);
    $("filter-clear").addEventListener("click", () => { $("filter-form").reset(); readFilter(); });
    $("replay-form").addEventListener("submit", confirmReplay);
    $("replay-note").addEventListener("input", () => { $("replay-error").textContent = ""; });
    $("resolve-note").addEventListener("input", () => { $("resolve-error").textContent = ""; });
    $("replay-cancel").addEventListener("click", () => { if (!(replay && replay.busy)) $("replay-dialog").close(); });
    $("replay-dialog").addEventListener("cancel", (ev) => { if (replay && replay.busy) ev.preventDefault(); });
    $("replay-dialog").addEventListener("close", () => { replay = null; afterDialog(); });
    $("resolve-form").addEventListener("submit", confirmResolve);
    $("resolve-cancel").addEventListener("click", () => $("resolve-dialog").close());
    $("resolve-dialog").addEventListener("close", () => { resolve = null; afterDialog(); });
    const saved = sessionStorage.getItem(ACTOR_KEY);
    if (saved) $("actor").value = saved;
    if (sessionStorage.getItem(TOKEN_KEY)) {
      start().catch((e) => { if (e.status !== 401) signOut("Could not reach the console: " + e.message); });
    } else {
      $("login").hidden = false;
      $("token").focus();
    }
  });
})();
