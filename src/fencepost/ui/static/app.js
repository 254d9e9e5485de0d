// fencepost console: live updates from the server's one change-feed follower, over one
// EventSource per page. No polling loop: the page only reacts to pushed events. Every value is
// written with textContent, never as HTML.
"use strict";

(function () {
  const page = document.body.dataset.page;
  const live = document.getElementById("live");

  function setLive(on, text) {
    if (!live) return;
    live.textContent = text;
    live.classList.toggle("on", on);
    live.classList.toggle("off", !on);
  }

  function flash(el) {
    el.classList.remove("flash");
    void el.offsetWidth; // restart the animation
    el.classList.add("flash");
  }

  function badge(status) {
    const span = document.createElement("span");
    span.className = "badge status-" + status;
    span.textContent = status;
    return span;
  }

  // Stored text as the server's pages show it: every control, invisible format (a bidi override,
  // a zero-width space), private-use or unassigned character and every space but U+0020 written
  // \xNN, \uNNNN or \UNNNNNNNN, so that it never reorders the page nor passes for other text.
  // Tab and line breaks stay.
  const HIDDEN = /[\p{Cc}\p{Cf}\p{Co}\p{Cn}\p{Cs}\p{Zl}\p{Zp}\p{Zs}]/gu;
  function shown(text) {
    return String(text).replace(HIDDEN, (ch) => {
      if (ch === " " || ch === "\t" || ch === "\n" || ch === "\r") return ch;
      const code = ch.codePointAt(0);
      const [prefix, width] = code <= 0xff ? ["\\x", 2] : code <= 0xffff ? ["\\u", 4] : ["\\U", 8];
      return prefix + code.toString(16).padStart(width, "0");
    });
  }

  function cell(text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = shown(text);
    return td;
  }

  // A run's page: /runs/<id> over one store, /runs/<store>/<id> over several, the id encoded whole
  // ("/" too). An id that is "." or ".." goes in ?id= (a browser resolves such a path segment),
  // as the server's own links do.
  function runHref(store, id) {
    const base = "/runs/" + (store ? encodeURIComponent(store) + "/" : "");
    return id === "." || id === ".." ? base + "?id=" + encodeURIComponent(id) : base + encodeURIComponent(id);
  }

  function fmtTime(ms) {
    if (ms === null || ms === undefined) return "-";
    return new Date(ms).toISOString().replace("T", " ").replace(/Z$/, "Z");
  }

  // ---------------------------------------------------------------- runs page
  // The newest page takes the runs created while it is open at its top, up to one page of them
  // (data-limit): past that, a notice counts the newer runs and links to the newest page, so a tab
  // left open on a busy store stays bounded. No row is ever dropped, so "older runs →" still starts
  // right after the last row shown, as when the page was rendered.
  const NOT_SHOWN_MAX = 1000;
  let addedLive = 0;
  const notShown = new Set(); // the newer runs past the cap (store, id): each counted once
  function noteNewer(store, id, deleted) {
    const box = document.getElementById("newer-runs");
    const key = JSON.stringify([store, id]);
    if (!box) return;
    if (deleted) { if (!notShown.delete(key)) return; }
    else if (notShown.has(key) || notShown.size >= NOT_SHOWN_MAX) return;
    else notShown.add(key);
    const n = notShown.size;
    box.firstElementChild.textContent = (n >= NOT_SHOWN_MAX ? n + "+" : String(n))
      + (n === 1 ? " newer run" : " newer runs") + " not shown: show the newest";
    box.hidden = n === 0;
    flash(box);
  }

  function onRunRuns(ev) {
    const tbody = document.querySelector("#runs tbody");
    if (!tbody) return;
    let row = null;
    const store = ev.store || "";
    for (const tr of tbody.querySelectorAll("tr[data-run-id]")) {
      if (tr.dataset.runId === ev.run_id && (tr.dataset.store || "") === store) { row = tr; break; }
    }
    if (row && Number(row.dataset.revision) >= ev.revision) return; // an older event
    if (ev.deleted) {
      if (row) { row.classList.add("deleted"); row.querySelector(".status").textContent = "deleted"; }
      else noteNewer(store, ev.run_id, true);
      return;
    }
    if (!row) {
      if (document.body.dataset.liveRows !== "prepend") return; // a filtered or older page
      // A run the page has no row for is new, unless older pages exist and it was created no later
      // than this page's oldest row: then it is one of theirs that changed (a worker claimed it),
      // and a reload would not show it here either.
      const rows = tbody.querySelectorAll("tr[data-run-id]");
      const oldest = rows.length ? Number(rows[rows.length - 1].dataset.created) : null;
      if (document.getElementById("next-page") && oldest !== null && ev.created_at_ms <= oldest) return;
      if (addedLive >= Number(document.body.dataset.limit)) { noteNewer(store, ev.run_id); return; }
      addedLive += 1;
      row = document.createElement("tr");
      row.dataset.runId = ev.run_id;
      row.dataset.created = String(ev.created_at_ms);
      if (store) { row.dataset.store = store; row.append(cell(store, "store mono")); }
      const link = document.createElement("a");
      link.href = runHref(store, ev.run_id);
      link.textContent = shown(ev.run_id);
      const first = document.createElement("td");
      first.appendChild(link);
      row.append(first, cell("", "status"), cell(ev.flow_name || "-"), cell("", "owner mono"),
        cell("", "cancel"), cell(fmtTime(ev.created_at_ms)), cell("-", "started"), cell("-", "finished"));
      const empty = tbody.querySelector("tr.empty");
      if (empty) empty.remove();
      tbody.insertBefore(row, tbody.firstChild);
    }
    row.dataset.revision = String(ev.revision);
    const status = row.querySelector(".status");
    status.replaceChildren(badge(ev.status));
    row.querySelector(".owner").textContent = shown(ev.owner || "-");
    row.querySelector(".cancel").textContent = ev.cancel_requested ? "requested" : "-";
    row.querySelector(".started").textContent = fmtTime(ev.started_at_ms);
    row.querySelector(".finished").textContent = fmtTime(ev.finished_at_ms);
    flash(row);
  }

  // Whether counts read as of feed position `at` are older than position `p` this page has seen.
  function older(at, p) {
    return Boolean(at && p && at.source === p.source && p.revision !== null && at.revision < p.revision);
  }

  // Over several stores: each store's counts as the page has them (rendered, then live), each
  // store's new ones taken only when its own as_of is not behind the page's position of that store;
  // a store that does not answer leaves the sum, as on the server. The shown counts are their sum.
  function countsAcross(stats) {
    const box = document.getElementById("counts");
    let byStore = {};
    try { byStore = JSON.parse(box.dataset.storeCounts || "{}"); } catch (e) { byStore = {}; }
    for (const name of Object.keys(stats.stores)) {
      const part = stats.stores[name];
      if (part.error) { delete byStore[name]; continue; }
      const p = position && position.stores ? position.stores[name] : null;
      if (part.counts && !older(part.as_of, p)) byStore[name] = part.counts;
    }
    box.dataset.storeCounts = JSON.stringify(byStore);
    const total = {};
    for (const counts of Object.values(byStore)) {
      for (const s of Object.keys(counts)) total[s] = (total[s] || 0) + counts[s];
    }
    return total;
  }

  function onStatsRuns(stats) {
    if (!stats.counts) return;
    let counts = stats.counts;
    if (stats.stores) {
      if (!document.getElementById("counts")) return;
      counts = countsAcross(stats);
    } else if (older(stats.as_of, position && !position.stores ? position : null)) {
      // The hub's last sample, sent as the stream opens, can be older than the counts this page was
      // rendered with (read after its position): counts as of an earlier revision are not shown.
      return;
    }
    for (const el of document.querySelectorAll("[data-count]")) {
      const n = counts[el.dataset.count];
      if (n !== undefined && el.textContent !== String(n)) { el.textContent = String(n); flash(el); }
    }
  }

  // ---------------------------------------------------------------- run page
  // The run was deleted (its page is a 404 now): keep its last state on screen, say so. Refreshes
  // run one at a time, the last after the last event, so the page ends as the run ends.
  function markRunGone() {
    const badgeEl = document.getElementById("run-status");
    if (badgeEl) { badgeEl.className = "badge status-deleted"; badgeEl.textContent = "deleted"; }
    const box = document.getElementById("run-body");
    if (!box || document.getElementById("run-gone")) return;
    const note = document.createElement("p");
    note.id = "run-gone";
    note.className = "gone";
    note.textContent = "this run was deleted: what follows is its last state";
    box.insertBefore(note, box.firstChild);
    flash(note);
  }

  let refreshing = false, again = false;
  function refreshRun() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    const href = runHref(document.body.dataset.store, document.body.dataset.runId);
    fetch(href + (href.includes("?") ? "&" : "?") + "fragment=1", { headers: { "accept": "text/html" } })
      .then((r) => {
        if (r.status === 404) markRunGone();
        return r.ok ? r.text() : null;
      })
      .then((html) => {
        if (html === null) return;
        // The fragment is the server's own autoescaped template: parse it inertly, then swap it in.
        const doc = new DOMParser().parseFromString(html, "text/html");
        const box = document.getElementById("run-body");
        box.replaceChildren(...doc.body.childNodes);
        flash(box);
      })
      .finally(() => { refreshing = false; if (again) { again = false; refreshRun(); } });
  }

  // ---------------------------------------------------------------- projections and health
  // Over several stores the stats carry each store's part and every page has a section per store.
  function perStore(stats, each) {
    if (!stats.stores) { each(document, stats); return; }
    for (const section of document.querySelectorAll("section.store[data-store]")) {
      const part = stats.stores[section.dataset.store];
      if (part) each(section, part);
    }
  }

  // A projection the page has no row for (built since it was rendered), or one rebuilt since
  // (its history and pending rebuild are not in the stats): the page reloads, once.
  function onStatsProjections(stats) {
    let stale = false;
    perStore(stats, (root, part) => {
      if (!part.projections) return;
      for (const p of part.projections) {
        const tr = root.querySelector('tr[data-projection="' + CSS.escape(p.name) + '"]');
        if (!tr) { stale = true; continue; }
        const rebuilds = tr.querySelector('[data-field="rebuilds"]');
        if (rebuilds && Number(rebuilds.textContent) < p.rebuilds) stale = true;
        for (const td of tr.querySelectorAll("[data-field]")) {
          const v = String(p[td.dataset.field]);
          if (td.textContent !== v) { td.textContent = v; flash(td); }
          if (td.dataset.field === "lag") td.classList.toggle("lagging", p.lag > 0);
        }
      }
    });
    if (stale) { if (source) source.close(); window.location.reload(); }
  }

  function onStatsHealth(stats) {
    // The sampling window under the figures: the console's own (the first store's over several).
    const parts = stats.stores ? Object.values(stats.stores) : [stats];
    const first = parts.find((part) => part.health);
    const windowEl = document.getElementById("window-s");
    if (first && windowEl && first.health.window_s != null) windowEl.textContent = String(first.health.window_s);
    perStore(stats, (root, part) => {
      const h = part.health;
      if (!h) return;
      const fields = root === document ? document.querySelectorAll("#health [data-field]")
        : root.querySelectorAll("[data-field]");
      const store = root === document ? "" : root.dataset.store;
      for (const td of fields) {
        const f = td.dataset.field;
        let v;
        if (f === "oldest_heartbeat") {
          if (!h.oldest_heartbeat) { v = "no running run"; }
          else {
            const o = h.oldest_heartbeat;
            const a = document.createElement("a");
            a.href = runHref(store, o.run_id);
            a.textContent = shown(o.run_id);
            const text = " at " + o.at + " (" + o.age_s + " s ago)";
            if (td.textContent !== a.textContent + text) { td.replaceChildren(a, document.createTextNode(text)); flash(td); }
            continue;
          }
        } else if (f === "subscribers") {
          v = h.follower ? String(h.follower.subscribers) : "-";
        } else {
          v = String(h[f]);
        }
        if (td.textContent !== v) { td.textContent = v; flash(td); }
      }
    });
  }

  // ---------------------------------------------------------------- the one stream
  if (!window.EventSource) { setLive(false, "no live updates"); return; }
  // The feed position this page has seen: the one it was rendered at (runs and run pages), then
  // each run event's, then the one its stream says it reached (hello). The stream is opened with
  // it (?since=), and the server first sends what changed after it, then the live changes: nothing
  // that changed between the render and the stream opening, or while the stream was away (the
  // console restarted, the network dropped), is missed. A position the server cannot replay from
  // (another source, too far behind) gets a "reset": the page reloads, once. The badge says "live"
  // from the hello on, once the page has caught up.
  let position = null;
  try { position = document.body.dataset.position ? JSON.parse(document.body.dataset.position) : null; }
  catch (e) { position = null; }
  function seen(ev) {
    if (position === null) return;
    const p = position.stores ? position.stores[ev.store || ""] : position;
    if (p && (p.revision === null || ev.revision > p.revision)) p.revision = ev.revision;
  }
  // ?since=: SOURCE:REVISION, or NAME=SOURCE:REVISION,... over several stores.
  function since() {
    if (position === null) return null;
    const at = (p) => p && p.source !== null && p.revision !== null ? p.source + ":" + p.revision : null;
    if (!position.stores) return at(position);
    // A store the page was rendered without (it did not answer) has no position: left out.
    const parts = Object.keys(position.stores).filter((n) => at(position.stores[n])).map((n) => n + "=" + at(position.stores[n]));
    return parts.length ? parts.join(",") : null;
  }
  // The stores this page was rendered without: the stream has the page reload once one answers.
  const renderedWithout = document.body.dataset.down || "";
  function streamUrl() {
    const query = [];
    if (since()) query.push("since=" + encodeURIComponent(since()));
    if (renderedWithout) query.push("down=" + encodeURIComponent(renderedWithout.split(" ").join(",")));
    return "/events" + (query.length ? "?" + query.join("&") : "");
  }
  // Over several stores, the stores that do not answer now (name: error code): the badge names them.
  let storesDown = {};
  function setLiveStores() {
    const names = Object.keys(storesDown);
    setLive(true, names.length ? "live · not answering: " + names.map((n) => shown(n)).join(", ") : "live");
  }
  let source = null, down = false;
  function connect() {
    source = new EventSource(streamUrl());
    // Reconnect ourselves, with the position seen so far (the browser's own retry would repeat the
    // first ?since=).
    source.addEventListener("error", () => {
      source.close();
      setLive(false, down ? "database unavailable" : "reconnecting");
      setTimeout(connect, 1000);
    });
    source.addEventListener("hello", (msg) => {
      position = JSON.parse(msg.data);
      storesDown = {};
      setLiveStores();
    });
    source.addEventListener("reset", () => { source.close(); window.location.reload(); });
    source.addEventListener("run", (msg) => {
      const ev = JSON.parse(msg.data);
      seen(ev);
      if (page === "runs") onRunRuns(ev);
      else if (page === "run" && ev.run_id === document.body.dataset.runId
               && (ev.store || "") === (document.body.dataset.store || "")) refreshRun();
    });
    // The database stopped answering (gone, renamed, unreachable): say so until stats flow again.
    // Over several stores, one store that stops answering is named; the others stay live.
    source.addEventListener("unavailable", (msg) => {
      const ev = JSON.parse(msg.data);
      if (ev.store !== undefined) { storesDown[ev.store] = ev.error; setLiveStores(); return; }
      down = true;
      setLive(false, "database unavailable");
    });
    source.addEventListener("stats", (msg) => {
      const stats = JSON.parse(msg.data);
      down = false;
      if (stats.stores) {
        storesDown = {};
        for (const n of Object.keys(stats.stores)) if (stats.stores[n].error) storesDown[n] = stats.stores[n].error;
      }
      setLiveStores();
      if (page === "runs") onStatsRuns(stats);
      else if (page === "projections") onStatsProjections(stats);
      else if (page === "health") onStatsHealth(stats);
    });
  }
  connect();
})();
