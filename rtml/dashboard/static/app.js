// The rtml dashboard: one page, a view per location hash, each drawn from the JSON API
// (/api/...) and drawn again every REFRESH_MS; a followed log reads on with long polls.
"use strict";

const REFRESH_MS = 2000;
const FOLLOW_WAIT_S = 20;
let timer = null;
let followed = null; // the log being followed: {offset}

const esc = (v) => String(v ?? "-").replace(/[&<>"']/g,
  (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
const $ = (id) => document.getElementById(id);

async function api(path) {
  const response = await fetch(path, {credentials: "same-origin"});
  if (response.status === 401) { location.href = "/login"; throw new Error("logged out"); }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function bytes(n) {
  if (n == null) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}
const BYTE_RESOURCES = ["memory", "object_store_memory"];
const amount = (name, v) => BYTE_RESOURCES.includes(name) ? bytes(v) : String(+v.toFixed(3));
const time = (ms) => ms ? new Date(ms).toLocaleString() : "-";
const state = (s) => `<span class="state-${esc(s)}">${esc(s)}</span>`;
const bar = (used, total) => total ?
  `<span class="bar"><span style="width:${Math.min(100, 100 * used / total).toFixed(1)}%"></span></span>` : "";

function table(id, columns, rows) {
  if (!rows.length) return `<p id="${id}-empty">None.</p>`;
  const head = columns.map(([title]) => `<th>${esc(title)}</th>`).join("");
  const body = rows.map((row) => "<tr>" + columns.map(([, cell]) =>
    `<td>${cell(row)}</td>`).join("") + "</tr>").join("");
  return `<table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

function counts(map) {
  const parts = Object.entries(map || {}).map(([k, n]) => `${n} ${state(k)}`);
  return parts.length ? parts.join(", ") : "none";
}

// -- views: [title, controls (drawn once), content (drawn every refresh)] -----------------

const views = {
  async cluster() {
    const c = await api("/api/cluster");
    const names = Object.keys(c.resources);
    const nodes = table("nodes-table", [
      ["Node", (n) => `<code>${esc(n.node_id)}</code>`],
      ["Address", (n) => esc(n.address) + (n.metrics_address ?
        `<br><small>metrics: http://${esc(n.metrics_address)}/metrics</small>` : "")],
      ["State", (n) => state(n.alive ? "ALIVE" : "DEAD")],
      ...names.map((name) => [name + " used/total", (n) => {
        const r = n.resources[name];
        return r ? `${esc(amount(name, r.used))} / ${esc(amount(name, r.total))} ${bar(r.used, r.total)}` : "-";
      }]),
      ["Last heartbeat", (n) => n.last_heartbeat ? esc(time(n.last_heartbeat * 1000)) : "-"],
    ], c.nodes);
    const totals = table("totals-table", [["Resource", (r) => esc(r[0])],
      ["Used", (r) => esc(amount(r[0], r[1].used))], ["Total", (r) => esc(amount(r[0], r[1].total))],
      ["", (r) => bar(r[1].used, r[1].total)]], Object.entries(c.resources));
    const demand = c.pending_demand.length ? table("demand-table", [
      ["Tasks waiting", (d) => esc(d.count)], ["Resources they need", (d) => `<code>${esc(JSON.stringify(d.shape))}</code>`],
    ], c.pending_demand) : `<p id="demand-none">No pending demand: every task fits a node.</p>`;
    const store = c.resources.object_store_memory || {used: 0, total: 0};
    return `<h2>Nodes</h2>${nodes}<h2>Resources (alive nodes)</h2>${totals}
      <p id="object-store">Object store: ${esc(bytes(store.used))} of ${esc(bytes(store.total))} used ${bar(store.used, store.total)}</p>
      <h2>Pending demand</h2>${demand}
      <h2>Tasks</h2><p id="task-counts">${counts(c.tasks)}</p>
      <h2>Actors</h2><p id="actor-counts">${counts(c.actors)}</p>`;
  },

  async jobs() {
    const jobs = await api("/api/jobs?detail=1");
    return table("jobs-table", [
      ["Job", (j) => `<code>${esc(j.job_id)}</code>`], ["Type", (j) => esc(j.type)],
      ["Status", (j) => state(j.status)], ["Entrypoint", (j) => `<code>${esc(j.entrypoint || "")}</code>`],
      ["Driver pid", (j) => esc(j.driver_info && j.driver_info.pid)],
      ["Start", (j) => esc(time(j.start_time))], ["End", (j) => esc(time(j.end_time))],
      ["Message", (j) => esc(j.message || "")],
    ], jobs);
  },

  async tasks(query) {
    const rows = await api("/api/tasks?detail=1&" + query);
    return table("tasks-table", [
      ["Task", (t) => `<a href="#task/${esc(t.task_id)}"><code>${esc(t.task_id)}</code></a>`],
      ["Name", (t) => esc(t.name)], ["State", (t) => state(t.state)],
      ["Attempt", (t) => esc(t.attempt_number)], ["Type", (t) => esc(t.type)],
      ["Node", (t) => `<code>${esc((t.node_id || "").slice(0, 12))}</code>`],
      ["Worker pid", (t) => esc(t.worker_pid)], ["Error", (t) => esc(t.error_type || "")],
      ["Submitted", (t) => esc(time(t.creation_time_ms))],
      ["Duration", (t) => t.end_time_ms && t.start_time_ms ? esc((t.end_time_ms - t.start_time_ms) + " ms") : "-"],
    ], rows);
  },

  async task(id) {
    const t = await api("/api/tasks/" + encodeURIComponent(id));
    const fields = ["task_id", "name", "state", "attempt_number", "job_id", "type", "func_or_class_name",
      "node_id", "worker_pid", "error_type", "creation_time_ms", "start_time_ms", "end_time_ms"];
    const spec = table("task-fields", [["Field", (f) => esc(f)], ["Value", (f) =>
      f.endsWith("_ms") ? esc(time(t[f])) : f === "state" ? state(t[f]) : `<code>${esc(t[f])}</code>`]], fields);
    const attempts = table("attempts-table", [
      ["Attempt", (a) => esc(a.attempt)], ["Status", (a) => state(a.status)],
      ["Start", (a) => esc(time(a.start_ts && a.start_ts * 1000))],
      ["End", (a) => esc(time(a.end_ts && a.end_ts * 1000))],
      ["Worker pid", (a) => esc(a.worker_pid)], ["Node", (a) => `<code>${esc((a.node_id || "").slice(0, 12))}</code>`],
      ["Error", (a) => esc(a.error_type || "")],
    ], t.attempts);
    let failure = "";
    if (t.state === "FAILED") {
      failure = `<h2>Error: ${esc(t.error_type)}</h2><pre id="task-error" class="error-text">${esc(t.error_message || "(no message recorded)")}</pre>
        <p>Run it again under a debugger: <code id="replay">${esc(t.replay)}</code></p>`;
    }
    return `${spec}<h2>Attempts</h2>${attempts}${failure}`;
  },

  async actors() {
    const rows = await api("/api/actors?detail=1");
    return table("actors-table", [
      ["Actor", (a) => `<code>${esc(a.actor_id)}</code>`], ["Class", (a) => esc(a.class_name)],
      ["State", (a) => state(a.state)], ["Name", (a) => esc(a.name || "")],
      ["Namespace", (a) => esc(a.ray_namespace)], ["Detached", (a) => esc(a.is_detached)],
      ["Restarts", (a) => esc(a.num_restarts)], ["Node", (a) => `<code>${esc((a.node_id || "").slice(0, 12))}</code>`],
      ["Pid", (a) => esc(a.pid)], ["Resources", (a) => `<code>${esc(JSON.stringify(a.required_resources))}</code>`],
      ["Death cause", (a) => esc(a.death_cause ? a.death_cause.actor_died_error_context.error_message : "")],
    ], rows);
  },

  async objects() {
    const m = await api("/api/memory");
    const owners = table("owners-table", [
      ["Owner", (g) => `<code>${esc(g.owner_id)}</code>`], ["Objects", (g) => esc(g.objects)],
      ["Size", (g) => esc(bytes(g.bytes))], ["Spilled", (g) => esc(bytes(g.spilled_bytes))],
      ["Nodes", (g) => esc(g.nodes.length)],
    ], m.owners);
    const objects = table("objects-table", [
      ["Object", (o) => `<code>${esc(o.object_id)}</code>`], ["Size", (o) => esc(bytes(o.object_size))],
      ["Owner", (o) => `<code>${esc(o.owner_id)}</code>`], ["Spilled", (o) => esc(o.spilled)],
      ["Where", (o) => Object.entries(o.locations || {}).map(([n, s]) =>
        `<code>${esc(n.slice(0, 12))}</code> ${esc(s)}`).join("<br>")],
      ["Reference", (o) => esc(o.reference_type)],
    ], m.objects.sort((a, b) => b.object_size - a.object_size));
    return `<p id="objects-total">${esc(m.total_objects)} object(s) in the object stores, ${esc(bytes(m.total_bytes))}
      in all, ${esc(bytes(m.spilled_bytes))} spilled to disk (small values live in their owners' memory).</p>
      <h2>By owner</h2>${owners}<h2>Objects</h2>${objects}`;
  },

  async logs(query) {
    const nodes = await api("/api/logs");
    fillNodes(nodes);
    const chosen = new URLSearchParams(query).get("node") || "";
    const shown = nodes.filter((n) => !chosen || n.node_id === chosen);
    if (!shown.length) return `<p id="logs-none">No alive node${chosen ? " " + esc(chosen) : ""}.</p>`;
    return shown.map((n) => `<h2>Node <code>${esc(n.node_id.slice(0, 12))}</code> at ${esc(n.address)}</h2>
      ${n.error ? `<p class="error">${esc(n.error)}</p>` : ""}${table("logs-" + n.node_id, [
      ["Log", (f) => `<a href="#log/${esc(n.node_id)}/${esc(encodeURIComponent(f.name))}">${esc(f.name)}</a>`],
      ["Size", (f) => esc(bytes(f.size))], ["Worker pid", (f) => f.pid ? esc(f.pid) : ""],
      ["Actor", (f) => f.actor_id ? `<code>${esc(f.actor_id)}</code>` : ""],
      ["Modified", (f) => esc(time(f.modified * 1000))],
    ], n.files)}`).join("");
  },

  async timeline() {
    const events = await api("/api/timeline");
    if (!events.length) return `<p id="timeline-empty">No task has run yet.</p>`;
    const start = Math.min(...events.map((e) => e.ts));
    const end = Math.max(...events.map((e) => e.ts + e.dur));
    const span = Math.max(end - start, 1);
    const lanes = new Map();
    for (const e of events) {
      const key = `${e.pid} / pid ${e.tid}`;
      if (!lanes.has(key)) lanes.set(key, []);
      lanes.get(key).push(e);
    }
    const rows = [...lanes.entries()].sort().map(([key, list]) => `<div class="lane">
      <span class="lane-label">node ${esc(key)}</span>${list.map((e) => `<div class="slice${e.args.status === "FAILED" ? " failed" : ""}"
      title="${esc(e.name)}: ${esc((e.dur / 1000).toFixed(2))} ms (${esc(e.args.status)})"
      style="left:${(20 + 78 * (e.ts - start) / span).toFixed(3)}%;width:${(78 * e.dur / span).toFixed(3)}%">${esc(e.name)}</div>`).join("")}</div>`);
    return `<p id="timeline-summary">${events.length} task(s) over ${esc((span / 1000).toFixed(1))} ms, one lane per worker.</p>
      <div class="lanes" id="timeline-lanes">${rows.join("")}</div>`;
  },
};

const titles = {cluster: "Cluster", jobs: "Jobs", tasks: "Tasks", task: "Task", actors: "Actors",
  objects: "Objects", logs: "Logs", log: "Log", timeline: "Timeline"};

// The node chooser of the logs view: drawn once with the view, its options filled (and
// kept) as the nodes come and go, so a refresh does not close it under the user.
function fillNodes(nodes) {
  const select = $("log-node");
  const ids = nodes.map((n) => n.node_id);
  if (!select || select.dataset.ids === ids.join()) return;
  const chosen = new URLSearchParams(route().query).get("node") || "";
  select.innerHTML = `<option value="">every node</option>` + nodes.map((n) =>
    `<option value="${esc(n.node_id)}">${esc(n.node_id.slice(0, 12))} (${esc(n.address)})</option>`).join("");
  select.value = ids.includes(chosen) ? chosen : "";
  select.dataset.ids = ids.join();
}

function route() {
  const [name, ...rest] = (location.hash.slice(1) || "cluster").split("/");
  const [view, query] = name.split("?");
  return {view: titles[view] ? view : "cluster", arg: decodeURIComponent(rest.join("/")), query: query || ""};
}

function controls({view, arg, query}) {
  if (view === "tasks") {
    const filters = new URLSearchParams(query).getAll("filter").join(", ");
    return `<form id="task-filter" class="controls">
      <input type="text" id="filter-input" value="${esc(filters)}" placeholder="state=FAILED, name=f, name!=g">
      <button type="submit">Filter</button> <span class="hint">KEY=VALUE or KEY!=VALUE, comma-separated; all must hold</span></form>`;
  }
  if (view === "timeline") {
    return `<p><a id="timeline-download" href="/api/timeline?download=1" download="timeline.json">Download the trace (Chrome trace JSON)</a>,
      then open it in chrome://tracing or ui.perfetto.dev.</p>`;
  }
  if (view === "logs") {
    return `<label class="controls">Node <select id="log-node"><option value="">every node</option></select></label>`;
  }
  if (view === "log") {
    const [node, name] = splitLog(arg);
    return `<label><input type="checkbox" id="follow" checked> Follow</label>
      <code id="log-name">${esc(name)}</code> on node <code>${esc(node.slice(0, 12))}</code>`;
  }
  return "";
}

async function draw() {
  const r = route();
  const hash = location.hash;
  if (r.view === "log") return;
  try {
    const html = await views[r.view](["tasks", "logs"].includes(r.view) ? r.query : r.arg);
    if (location.hash !== hash) return; // the user moved on meanwhile
    $("content").innerHTML = html;
    $("error").textContent = "";
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    $("error").textContent = String(err.message || err);
  }
}

// "#log/NODE/NAME" names a file of one node: [NODE, NAME].
function splitLog(arg) {
  const slash = arg.indexOf("/");
  return slash < 0 ? ["", arg] : [arg.slice(0, slash), arg.slice(slash + 1)];
}

async function follow(arg) {
  const [node, name] = splitLog(arg);
  const path = `/api/logs/${encodeURIComponent(node)}/${encodeURIComponent(name)}`;
  const mine = {offset: -65536};
  followed = mine;
  $("content").innerHTML = `<pre id="log-text"></pre>`;
  while (followed === mine) {
    try {
      const wait = $("follow") && $("follow").checked ? FOLLOW_WAIT_S : 0;
      const chunk = await api(`${path}?offset=${mine.offset}&wait=${wait}`);
      if (followed !== mine) return;
      const pre = $("log-text");
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent += chunk.text;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
      mine.offset = chunk.next_offset;
      $("error").textContent = "";
      $("updated").textContent = "read " + new Date().toLocaleTimeString();
      if (!wait) await new Promise((done) => setTimeout(done, REFRESH_MS));
    } catch (err) {
      $("error").textContent = String(err.message || err);
      await new Promise((done) => setTimeout(done, REFRESH_MS));
    }
  }
}

function show() {
  const r = route();
  followed = null;
  clearInterval(timer);
  $("view-title").textContent = titles[r.view] + (r.arg && r.view !== "log" ? " " + r.arg : "");
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.getAttribute("href") === "#" + (r.view === "task" ? "tasks" : r.view === "log" ? "logs" : r.view));
  }
  $("controls").innerHTML = controls(r);
  $("content").innerHTML = "";
  const nodes = $("log-node");
  if (nodes) {
    nodes.addEventListener("change", () => {
      location.hash = "logs" + (nodes.value ? "?node=" + encodeURIComponent(nodes.value) : "");
    });
  }
  const form = $("task-filter");
  if (form) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const params = new URLSearchParams();
      for (const part of $("filter-input").value.split(",")) if (part.trim()) params.append("filter", part.trim());
      location.hash = "tasks" + (params.toString() ? "?" + params : "");
    });
  }
  if (r.view === "log") { follow(r.arg); return; }
  draw();
  timer = setInterval(draw, REFRESH_MS);
}

window.addEventListener("hashchange", show);
document.addEventListener("DOMContentLoaded", show);
