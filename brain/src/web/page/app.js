// Tether's web page: plain JavaScript, no build step. Everything a model, a command or a
// file wrote is put in the page as text (textContent, text nodes), never as markup.
"use strict";

const state = { session: null, stream: null, tasks: new Map(), workers: [] };

// ------------------------------------------------------------------ helpers

// el("td", {class: "x"}, "text", child): strings become text nodes, never HTML.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function banner(text) {
  const b = document.getElementById("banner");
  b.textContent = text || "";
  b.hidden = !text;
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (state.session && state.session.csrf) headers["X-Tether-CSRF"] = state.session.csrf;
  }
  const r = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const type = r.headers.get("content-type") || "";
  const data = type.includes("json") ? await r.json() : await r.text();
  if (!r.ok) {
    const msg = data && data.error ? data.error.message : String(data);
    throw new Error(msg);
  }
  return data;
}

async function act(what, f) {
  try {
    await f();
    banner("");
  } catch (e) {
    banner(what + ": " + e.message);
  }
}

function age(ms) {
  ms = Number(ms); // a 64-bit field: a string on the wire
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.round(s / 60) + "m";
  if (s < 86400) return Math.round(s / 3600) + "h";
  return Math.round(s / 86400) + "d";
}

// tether.v1.WorkerState, by number.
const WORKER_STATES = ["unknown", "enrolled", "connected", "lost", "revoked"];
function workerState(n) { return WORKER_STATES[n] || String(n); }

// The API writes 64-bit integers as strings (proto3's JSON mapping), so ids above 2^53 keep
// their last digits: call and approval ids stay strings (compared, never added). A record's
// sequence number and time fit a number exactly and are compared and subtracted: numbers.
function timed(r) {
  r.seq = Number(r.seq);
  r.at_ms = Number(r.at_ms);
  return r;
}

function money(x) { return "$" + (x || 0).toFixed(4); }

function badge(text) { return text ? el("span", { class: "badge " + text }, text.replace("_", " ")) : ""; }

function closeStream() {
  if (state.stream) { state.stream.close(); state.stream = null; }
  clearTimeout(state.retry);
}

// An EventSource that reconnects by itself after the browser gave up (the brain restarted,
// or answered an error): from the last sequence number it saw.
function follow(url, handlers, lastSeq) {
  closeStream();
  const sep = url.includes("?") ? "&" : "?";
  const src = new EventSource(lastSeq ? url + sep + "since=" + lastSeq() : url);
  for (const [name, f] of Object.entries(handlers)) src.addEventListener(name, f);
  src.addEventListener("end", () => { src.close(); });
  // The credential ended (expired, revoked, logged out): no reconnecting, say why.
  src.addEventListener("closed", (e) => {
    src.close();
    let why = "this session has ended: log in again";
    try { why = JSON.parse(e.data).error.message; } catch (_) { /* keep the default */ }
    banner(why);
  });
  src.onopen = () => { if (document.getElementById("banner").textContent.startsWith("reconnecting")) banner(""); };
  src.onerror = () => {
    if (src.readyState === EventSource.CLOSED && state.stream === src) {
      banner("reconnecting to the brain…");
      state.retry = setTimeout(() => follow(url, handlers, lastSeq), 1000);
    } else if (src.readyState === EventSource.CONNECTING) {
      banner("reconnecting to the brain…");
    }
  };
  state.stream = src;
  return src;
}

// ------------------------------------------------------------------ views

function route() {
  closeStream();
  banner("");
  const h = location.hash || "#/";
  const view = document.getElementById("view");
  view.replaceChildren();
  let m;
  if ((m = h.match(/^#\/task\/([A-Za-z0-9-]+)$/))) return taskView(view, m[1]);
  if (h === "#/workers") return workersView(view);
  if (h === "#/machines") return machinesView(view);
  if (h === "#/new") return newView(view);
  return tasksView(view);
}

const ENDED = ["finished", "failed", "cancelled", "stuck", "stalled"];

// Which tasks a status filter keeps.
const FILTERS = {
  all: () => true,
  active: t => !ENDED.includes(t.status),
  waiting: t => t.status === "waiting" || t.status === "budget_exhausted",
  ended: t => ENDED.includes(t.status),
};

// The task list: newest first, each task's attempts under it, filtered by a status and by
// words (in the id, goal, status, worker or model). Columns a narrow screen does without are
// marked `wide`.
function tasksView(view) {
  const body = el("tbody", { id: "tasks" });
  const words = el("input", { type: "search", id: "filter", placeholder: "filter: id, goal, worker, model", "aria-label": "filter tasks" });
  const which = el("select", { id: "filter-status", "aria-label": "status" },
    el("option", { value: "all" }, "all"), el("option", { value: "active" }, "active"),
    el("option", { value: "waiting" }, "waiting for a person"), el("option", { value: "ended" }, "ended"));
  const count = el("span", { class: "muted", id: "count" });
  const names = {};
  const wide = h => ["Worker", "Model", "Steps", "Tokens", "Age"].includes(h) ? "wide" : undefined;
  const heads = ["Task", "Status", "Verified", "Goal", "Worker", "Model", "Steps", "Tokens", "Cost / budget", "Age"];
  view.append(el("h2", {}, "Tasks"), el("div", { class: "filters" }, words, which, count),
    el("table", { class: "tasks" }, el("thead", {}, el("tr", {}, heads.map(h => h === "Cost / budget" ? el("th", {}, "Cost", el("span", { class: "wide" }, " / budget")) : el("th", { class: wide(h) }, h)))), body));
  const row = (t, child) => el("tr", { "data-task": t.id, class: child ? "attempt-row" : undefined },
    el("td", { class: "id" }, child ? "↳ " : "", el("a", { href: "#/task/" + t.id }, t.id)),
    el("td", { class: "status" }, badge(t.status), " ", el("span", { class: "muted reason" }, t.reason || "")),
    el("td", {}, badge(t.verification)),
    el("td", { class: "goal", title: t.goal }, child ? "attempt " + t.attempt_number : t.goal),
    el("td", { class: "wide" }, names[t.worker] || t.worker),
    el("td", { class: "wide" }, t.model),
    el("td", { class: "wide" }, t.steps_total ? t.steps_done + "/" + t.steps_total : String(t.steps_done || 0)),
    el("td", { class: "wide" }, String(t.tokens || 0)),
    el("td", {}, money(t.spent_usd), t.limits && t.limits.usd ? el("span", { class: "wide" }, " / " + money(t.limits.usd)) : ""),
    el("td", { class: "wide" }, age(t.created_unix_ms)));
  const render = () => {
    const all = [...state.tasks.values()];
    const kids = new Map();
    for (const t of all) if (t.attempt_of && state.tasks.has(t.attempt_of)) {
      if (!kids.has(t.attempt_of)) kids.set(t.attempt_of, []);
      kids.get(t.attempt_of).push(t);
    }
    const tops = all.filter(t => !(t.attempt_of && state.tasks.has(t.attempt_of)))
      .sort((a, b) => Number(b.created_unix_ms || 0) - Number(a.created_unix_ms || 0));
    const q = words.value.trim().toLowerCase();
    const keep = t => FILTERS[which.value](t) && (!q || [t.id, t.goal, t.status, t.worker, names[t.worker], t.model]
      .some(f => f && String(f).toLowerCase().includes(q)));
    const rows = [];
    let shown = 0;
    for (const t of tops) {
      const mine = (kids.get(t.id) || []).sort((a, b) => a.attempt_number - b.attempt_number);
      if (!keep(t) && !mine.some(keep)) continue;
      shown++;
      rows.push(row(t, false), ...mine.map(k => row(k, true)));
    }
    body.replaceChildren(...rows);
    const n = x => x + (x === 1 ? " task" : " tasks");
    count.textContent = shown === tops.length ? n(tops.length) : shown + " of " + n(tops.length);
  };
  words.addEventListener("input", render);
  which.addEventListener("change", render);
  api("GET", "/api/workers").then(r => {
    for (const w of r.workers || []) names[w.id] = w.name || w.id;
    render();
  }).catch(() => {});
  follow("/api/events", {
    tasks: e => { state.tasks = new Map(JSON.parse(e.data).tasks.map(t => [t.id, t])); render(); },
    task: e => { const t = JSON.parse(e.data); state.tasks.set(t.id, t); render(); },
  });
  render();
}

// What one record says, as a person reads it: [class, text, detail]. The class says what
// kind of line it is; the detail (a command's output, an edit as a diff, the model's text) is
// shown under it. The raw record is one click away on every line.
function callText(c) {
  switch (c.tool) {
    case "run_command": {
      const argv = c.argv || [];
      const cmd = argv.length === 3 && argv[0] === "sh" && argv[1] === "-c" ? argv[2] : argv.join(" ");
      return ["$ " + cmd + (c.cwd ? "   (in " + c.cwd + ")" : ""), ""];
    }
    case "write_file": {
      const lines = (c.content || "").split("\n");
      if (lines.length && lines[lines.length - 1] === "") lines.pop();
      return ["wrote " + c.path + " (" + lines.length + " lines)", lines.map(l => "+" + l).join("\n")];
    }
    case "edit_file": {
      const minus = (c.old || "").split("\n").map(l => "-" + l);
      const plus = (c.new || "").split("\n").map(l => "+" + l);
      return ["edited " + c.path, minus.concat(plus).join("\n")];
    }
    case "read_file": return ["read " + c.path + (c.start_line || c.end_line ? " lines " + (c.start_line || 1) + "–" + (c.end_line || "end") : ""), ""];
    case "list_files": return ["listed " + (c.glob || "the files"), ""];
    case "search": return ["searched for " + c.pattern + (c.glob ? " in " + c.glob : ""), ""];
    default: return [c.tool || "call", JSON.stringify(c)];
  }
}

function exitText(res) {
  if (!res) return "";
  if (res.error) return "error: " + res.error;
  if (res.timed_out) return "timed out";
  if (res.signal) return "killed by signal " + res.signal;
  return "exit " + (res.exit_code === undefined || res.exit_code === null ? "?" : res.exit_code) + (res.limit ? " (" + res.limit + ")" : "");
}

function describe(r, calls, names) {
  const k = r.kind;
  const who = w => (names && names[w]) || w;
  switch (k) {
    case "created": return ["", "created: " + r.goal + (r.attempts ? " — as " + r.attempts.count + " attempts, pick " + r.attempts.pick : "") + (r.attempt_of ? " — attempt " + (r.attempt_of.index + 1) + " of " + r.attempt_of.parent : ""), ""];
    case "status_changed": return [r.status === "waiting" ? "approval" : "", "status " + r.status + (r.reason ? ": " + r.reason : ""), ""];
    case "llm_request": return ["turn", "asked " + r.model + " (" + r.messages + " messages)", ""];
    case "llm_response": {
      const m = (r.response && r.response.message) || {};
      const calls = (m.tool_calls || []).map(c => "→ " + c.name + " " + c.arguments).join("\n");
      return ["turn", "the model answered (" + (Number(r.prompt_tokens) + Number(r.completion_tokens)) + " tokens, " + money(r.cost_usd) + ")", (m.content || "") + (calls ? (m.content ? "\n" : "") + calls : "")];
    }
    case "tool_call_issued": {
      const [head, detail] = callText(r.call || {});
      const check = r.purpose === "acceptance";
      return [check ? "check" : "call", (check ? "the acceptance check: " : "") + head, detail];
    }
    case "tool_output": return ["", "", ""];
    case "tool_call_completed": {
      const issued = calls.get(r.call_id);
      const check = issued && issued.purpose === "acceptance";
      const ok = r.result && r.result.exit_code === 0 && !r.result.timed_out && !r.result.error;
      if (check) return [ok ? "check" : "bad", "the check " + (ok ? "passes" : "fails") + " (" + exitText(r.result) + ")", ""];
      return [ok ? "" : "bad", "→ " + exitText(r.result), ""];
    }
    case "tool_call_interrupted": { const c = calls.get(r.call_id); return ["bad", "call " + (c ? "#" + c.seq : r.call_id) + " interrupted: " + r.reason, ""]; }
    case "observation": return [r.failed ? "bad" : "", "told the model", r.text];
    case "barrier": return ["", "workspace synced (v" + r.version + "): " + r.files + " files, " + (r.wire_bytes || 0) + " bytes sent", ""];
    case "approval_requested": return ["approval", "approval needed: " + r.what, ""];
    case "approval_decided": return ["approval", (r.approved ? (r.always ? "approved for the rest of the task" : "approved") : "denied") + " by " + r.by + (r.reason ? ": " + r.reason : ""), ""];
    case "worker_assigned": return ["move", "on " + who(r.worker), ""];
    case "move_started": return ["move", "moving " + who(r.from) + " → " + who(r.to), ""];
    case "move_completed": return ["move", "moved to " + who(r.to) + " (" + r.files + " files, " + r.wire_bytes + " bytes)", ""];
    case "move_aborted": return ["bad", "move to " + who(r.to) + " aborted: " + r.reason, ""];
    case "attempt_started": return ["move", "attempt " + (r.index + 1) + " started: " + r.attempt + " on " + r.model + (r.escalation ? " (the attempts before it all failed)" : ""), ""];
    case "attempt_ended": {
      const e = r.end || {};
      return [e.verified ? "check" : "bad", "attempt " + (r.index + 1) + " ended " + e.status + (e.verified ? ", verified" : "") + ": " + (e.files_changed || 0) + " files, " + (e.lines_changed || 0) + " lines changed" + (e.reason ? " (" + e.reason + ")" : ""), ""];
    }
    case "attempt_picked": return ["check", "attempt " + (r.index + 1) + " (" + r.attempt + ") won: " + r.why, ""];
    case "delivery_pushed": return ["check", "pushed " + r.branch + " at " + r.commit, ""];
    case "pull_request_opened": return ["check", "pull request " + r.url, ""];
    case "delivered": return ["check", "delivered " + r.branch, ""];
    case "delivery_failed": return ["bad", "delivery failed: " + r.reason, ""];
    case "finished": return [r.outcome === "finished" ? "check" : "bad", "ended " + r.outcome + (r.verified === true ? ", verified" : r.verified === false ? ", unverified" : "") + (r.reason ? ": " + r.reason : ""), ""];
    case "surveyed": {
      const f = r.files || [];
      if (!f.length) return ["", "surveyed the workspace: it is empty", ""];
      return ["", "surveyed " + f.length + (r.truncated ? "+" : "") + " files: " + f.slice(0, 8).join(", ") + (f.length > 8 ? ", …" : "") + (r.readme_path ? "; read " + r.readme_path : "") + (r.agents_md_path ? "; the repository's instructions for agents: " + r.agents_md_path : ""), r.agents_md || ""];
    }
    case "workspace_seeded": return ["", "workspace from " + r.source + (r.commit ? " at " + r.commit.slice(0, 12) : "") + ": " + r.files + " files, " + r.bytes + " bytes", ""];
    case "check_after_changes": return [r.passed ? "check" : "bad", "check after the model's changes: " + (r.passed ? "passes" : "fails"), ""];
    case "code_in_view": return ["", "code in view for the model", r.text];
    case "instructions_in_view": return ["", "instructions for agents shown to the model: " + r.path, r.text];
    case "changes_undone": return ["bad", "changes undone: " + (r.restored || []).length + " files back as they were", ""];
    case "finished_for_model": return ["check", "the brain calls finish for the model, which " + r.why + ", on the version that passed", ""];
    case "protected_restored": return ["", "restored the check's files before the check: " + (r.paths || []).join(", "), ""];
    case "context_elided": return ["", "elided old tool outputs in the first " + r.upto + " messages (" + r.bytes_saved + " bytes) to fit the context window", ""];
    case "budget_raised": return ["", "budget raised", ""];
    case "egress_refused": return ["bad", "egress refused: " + r.host + ":" + r.port + ": " + r.reason, ""];
    case "left_out": return ["bad", "left out of the mirror on " + who(r.worker) + " (not synced, not moved)", (r.entries || []).map(e => e.path + ": " + e.reason).join("\n") + (Number(r.more) ? "\n… and " + r.more + " more" : "")];
    case "delivery_planned": return ["", "to be delivered as a " + r.mode + " when it finishes", ""];
    case "delivery_started": return ["", "delivering " + (r.commit || "").slice(0, 12) + " as " + r.branch + (r.wip ? " (work in progress)" : ""), ""];
    default: return ["", k.replace(/_/g, " "), ""];
  }
}

// Workers as lanes over time, moves as arrows (red: a failover, after the worker was lost),
// waits shaded (yellow: for a person's approval; grey: for a lost worker or anything else).
function lanes(records, now, names) {
  const spans = [], moves = [], waits = [];
  let cur = null, since = 0, wait = null, end = now, lost = false;
  for (const r of records) {
    if (r.kind === "worker_assigned" || r.kind === "move_completed") {
      const w = r.worker || r.to;
      if (cur && cur !== w) { spans.push([cur, since, r.at_ms]); moves.push([cur, w, r.at_ms, lost]); }
      if (cur !== w) { cur = w; since = r.at_ms; }
      lost = false;
    }
    if (r.kind === "status_changed") {
      if (wait) { waits.push([wait.from, r.at_ms, wait.approval]); wait = null; }
      if (r.status === "waiting") {
        wait = { from: r.at_ms, approval: /approval/i.test(r.reason || "") };
        if (/^waiting for worker/i.test(r.reason || "")) lost = true;
      }
    }
    if (r.kind === "finished") end = r.at_ms;
  }
  if (cur) spans.push([cur, since, end]);
  if (wait) waits.push([wait.from, end, wait.approval]);
  return drawLanes(spans, moves, waits, records.length ? records[0].at_ms : now, end, names);
}

// A task run as attempts: one lane per worker, a bar per attempt from its start to its end
// (green: the winner).
function attemptLanes(records, attempts, now, names) {
  const started = {}, ended = {};
  let end = now;
  for (const r of records) {
    if (r.kind === "attempt_started") started[r.attempt] = r.at_ms;
    if (r.kind === "attempt_ended") ended[r.index] = r.at_ms;
    if (r.kind === "finished") end = r.at_ms;
  }
  const spans = attempts.filter(a => a.worker && started[a.task_id] !== undefined)
    .map(a => [a.worker, started[a.task_id], ended[a.number - 1] || end, a.verified ? "#86efac" : "#93c5fd"]);
  return drawLanes(spans, [], [], records.length ? records[0].at_ms : now, end, names);
}

function drawLanes(spans, moves, waits, t0, end, names) {
  const workers = [...new Set(spans.map(s => s[0]))];
  const t1 = Math.max(end, t0 + 1);
  const W = 640, H = 28 * Math.max(1, workers.length) + 10, L = 120;
  const x = t => L + (W - L - 10) * (t - t0) / (t1 - t0);
  const y = w => 10 + 28 * workers.indexOf(w);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "lanes"); svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("viewBox", "0 0 " + W + " " + H); // scales down on a narrow screen
  svg.setAttribute("data-lanes", workers.join(","));
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  for (const [a, b, approval] of waits) add("rect", { x: x(a), y: 0, width: Math.max(1, x(b) - x(a)), height: H, fill: approval ? "#fef3c7" : "#e5e7eb", "data-wait": approval ? "approval" : "other" });
  for (const w of workers) add("text", { x: 4, y: y(w) + 12, "font-size": 12 }, (names && names[w]) || w);
  for (const [w, a, b, fill] of spans) add("rect", { x: x(a), y: y(w), width: Math.max(2, x(b) - x(a)), height: 16, fill: fill || "#93c5fd", "data-worker": w });
  for (const [from, to, t, failover] of moves) {
    add("line", { x1: x(t), y1: y(from) + 8, x2: x(t), y2: y(to) + 8, stroke: failover ? "#b91c1c" : "#0891b2", "stroke-width": 2, "data-move": from + "→" + to, "data-failover": failover ? "yes" : "no" });
    add("circle", { cx: x(t), cy: y(to) + 8, r: 3, fill: failover ? "#b91c1c" : "#0891b2" });
  }
  return svg;
}

function taskView(view, id) {
  const summary = el("div", { id: "summary" });
  const approvals = el("div", { id: "approvals" });
  const actions = el("div", { class: "actions" });
  const timeline = el("ol", { class: "timeline", id: "timeline" });
  const lanesBox = el("div", { id: "lanes" });
  const attemptsBox = el("div", { id: "attempts" });
  let attempts = [];
  // Diffs a person opened, by attempt: the list is drawn again as records come, and an open
  // diff stays open through that.
  const openDiffs = new Map();
  const diffBox = el("pre", { id: "diff", hidden: true });
  view.append(el("h2", {}, "Task " + id), summary, approvals, actions, attemptsBox, lanesBox,
    el("div", { class: "grid" }, el("div", {}, el("h3", {}, "Timeline ", el("label", { class: "muted every" }, el("input", { type: "checkbox", id: "every", onchange: e => timeline.classList.toggle("every", e.target.checked) }), " show every record")), timeline),
      el("div", {}, el("h3", {}, "Workspace"), el("button", { id: "show-diff", type: "button", onclick: showDiff }, "Show diff against the base"), diffBox)));
  const records = [];
  const names = {};
  const outputs = new Map();
  const calls = new Map();
  const pending = new Map();
  let last = 0, refresh = null;

  async function showDiff() {
    await act("diff", async () => {
      const text = await api("GET", "/api/tasks/" + id + "/diff");
      diffBox.textContent = text || "(no change)";
      diffBox.hidden = false;
    });
  }

  async function loadSummary() {
    try {
      const t = await api("GET", "/api/tasks/" + id);
      summary.replaceChildren(
        el("p", {}, badge(t.status), " ", badge(t.verification), " ", el("span", { class: "muted" }, t.reason || "")),
        el("p", { class: "goal" }, t.goal),
        el("p", { class: "muted" }, "worker " + (names[t.worker] || t.worker || "-") + " · model " + (t.model || "-") + " · " + (t.tokens || 0) + " tokens · " + money(t.spent_usd) +
          (t.limits && t.limits.usd ? " of " + money(t.limits.usd) : "") + (t.check ? " · check: " + t.check + " → " + (t.check_result || "not run") : "") +
          (t.delivery ? " · delivery: " + t.delivery : "")),
        t.delivery_url ? el("p", {}, el("a", { href: t.delivery_url, rel: "noopener noreferrer", target: "_blank" }, t.delivery_url)) : "",
        t.attempt_of ? el("p", {}, "attempt " + t.attempt_number + " of ", el("a", { href: "#/task/" + t.attempt_of }, t.attempt_of)) : "");
      renderAttempts(t);
      showActions(t);
    } catch (e) { banner(e.message); }
  }

  // Only the actions that apply to the task as it stands: an ended task cannot be moved or
  // cancelled, only one stopped for its budget can be resumed, only a finished one delivered.
  function showActions(t) {
    const ended = ["finished", "failed", "cancelled", "stuck", "stalled"].includes(t.status);
    const resumable = t.status === "budget_exhausted";
    const applies = {
      "move-to": !ended, "move": !ended, "cancel": !ended,
      "more-steps": resumable, "resume": resumable,
      "deliver-pr": t.status === "finished", "deliver": t.status === "finished",
    };
    for (const [name, on] of Object.entries(applies)) {
      const e = document.getElementById(name);
      if (e) (e.closest("label") || e).hidden = !on;
    }
  }

  // Attempts side by side: status, check, change, and each one's diff on demand.
  function renderAttempts(t) {
    attempts = t.attempts || [];
    if (!attempts.length) { attemptsBox.replaceChildren(); return; }
    attemptsBox.replaceChildren(el("h3", {}, attempts.length + " attempts (pick " + t.pick + ")"),
      el("div", { class: "attempts" }, ...attempts.map(a => {
        const diff = el("pre", { class: "attempt-diff", hidden: !openDiffs.has(a.task_id) }, openDiffs.get(a.task_id) || "");
        const show = async () => act("diff", async () => {
          openDiffs.set(a.task_id, (await api("GET", "/api/tasks/" + a.task_id + "/diff")) || "(no change)");
          // The list may have been drawn again while the diff came: fill the one shown now.
          const now = attemptsBox.querySelector('.attempt[data-attempt="' + a.task_id + '"] .attempt-diff');
          if (now) { now.textContent = openDiffs.get(a.task_id); now.hidden = false; }
        });
        return el("div", { class: "attempt" + (a.task_id === t.picked ? " won" : ""), "data-attempt": a.task_id },
          el("p", {}, el("strong", {}, "#" + a.number + " "), el("a", { href: "#/task/" + a.task_id }, a.task_id), " ", badge(a.status), a.task_id === t.picked ? " won" : ""),
          el("p", { class: "muted" }, (a.model || "") + (a.escalation ? " (escalated)" : "") + " · " + ((names[a.worker]) || a.worker || "not placed")),
          el("p", { class: "check-verdict" }, "check: " + (a.check || "not run")),
          el("p", { class: "muted" }, a.steps + " steps · " + a.tokens + " tokens" + (Number(a.files_changed) || Number(a.lines_changed) ? " · " + a.files_changed + " files, " + a.lines_changed + " lines" : "")),
          a.reason ? el("p", { class: "muted" }, a.reason) : "",
          el("button", { type: "button", class: "attempt-show-diff", onclick: show }, "Diff"), diff);
      })));
    lanesBox.replaceChildren(attemptLanes(records, attempts, Date.now(), names));
  }

  function renderApprovals() {
    approvals.replaceChildren(...[...pending.values()].map(a => {
      const reason = el("input", { type: "text", placeholder: "reason (told to the model)", class: "deny-reason" });
      return el("div", { class: "approval-box", "data-approval": a.approval_id },
        el("p", {}, "Waiting for approval: ", el("code", {}, a.what)),
        el("button", { type: "button", class: "approve", onclick: () => act("approve", () => api("POST", "/api/tasks/" + id + "/approve")) }, "Approve"),
        " ", el("button", { type: "button", class: "always", title: "the same command in the same directory (or any change to the same file) is not asked again in this task", onclick: () => act("approve", () => api("POST", "/api/tasks/" + id + "/approve", { always: true })) }, "Always"),
        " ", reason, " ",
        el("button", { type: "button", class: "deny", onclick: () => act("deny", () => api("POST", "/api/tasks/" + id + "/deny", { reason: reason.value })) }, "Deny"));
    }));
  }

  // Records a person need not read: status changes the other lines already say, syncs and
  // requests to the model. Their lines stay in the timeline, folded (`Show every record`
  // unfolds them).
  function bookkeeping(r) {
    return (r.kind === "status_changed" && ["created", "queued", "running", "waiting"].includes(r.status))
      || ["barrier", "llm_request", "snapshot", "tool_output"].includes(r.kind)
      || (r.kind === "llm_response" && !((r.response && r.response.message && r.response.message.content) || "").trim()
        && !((r.response && r.response.message && r.response.message.tool_calls) || []).length);
  }

  // The line of the call a record belongs to (a completion, its output, what the model was
  // told of it), or nothing when it belongs to none shown.
  let lastCall = null;
  function fold(r, li) {
    if (bookkeeping(r)) { li.classList.add("folded"); return; }
    if (r.kind === "tool_call_completed") {
      const issued = calls.get(r.call_id);
      const line = callLines.get(r.call_id);
      if (!issued || issued.purpose === "acceptance" || !line) return;
      // The exit goes on the call's own line; its record's line folds.
      const ok = r.result && r.result.exit_code === 0 && !r.result.timed_out && !r.result.error;
      line.querySelector(".what").after(el("span", { class: ok ? "exit muted" : "exit bad" }, "  → " + exitText(r.result)));
      li.classList.add("folded");
      return;
    }
    if (r.kind === "observation" && lastCall) {
      const [issued, out] = lastCall;
      lastCall = null;
      const [text, note] = r.text.split("\n\nNote: ");
      // A command's output is under it already; a file tool's answer goes there.
      if (!(issued.call && issued.call.tool === "run_command")) out.textContent = text;
      if (note) {
        li.querySelector(".what").textContent = "note to the model: " + note;
        const d = li.querySelector("pre.detail");
        if (d) d.remove();
        return;
      }
      li.classList.add("folded");
    }
  }

  const callLines = new Map();
  const settled = new Set();
  function add(r) {
    if (r.seq <= last) return; // never twice, whatever the network did
    last = r.seq;
    records.push(r);
    if (r.kind === "tool_call_issued") calls.set(r.call_id, r);
    if (r.kind === "tool_output" && outputs.has(r.call_id)) {
      // A call's output goes under the call; its own line stays, folded, so every record
      // has its line.
      outputs.get(r.call_id).textContent = (r.stdout || "") + (r.stderr || "");
      settled.add(r.call_id); // live output that comes late is already in it
      timeline.append(el("li", { class: "folded", "data-seq": r.seq, "data-kind": r.kind }, "output of call " + r.call_id));
    } else {
      const [cls, text, detail] = describe(r, calls, names);
      // The raw record behind the line's number.
      const raw = el("details", { class: "raw" }, el("summary", { title: "the raw record" }, "#" + r.seq), el("pre", {}, JSON.stringify(r, null, 2)));
      const li = el("li", { class: cls, "data-seq": r.seq, "data-kind": r.kind }, raw, el("span", { class: "what" }, text));
      if (detail) li.append(el("pre", { class: r.kind === "tool_call_issued" && r.call && /_file$/.test(r.call.tool) ? "detail diff" : "detail" }, detail));
      if (r.kind === "tool_call_issued") {
        const out = el("pre", { class: "output", "data-call": r.call_id });
        outputs.set(r.call_id, out);
        callLines.set(r.call_id, li);
        li.append(out);
        if (r.purpose !== "acceptance") lastCall = [r, out];
      }
      timeline.append(li);
      fold(r, li);
    }
    if (r.kind === "approval_requested") pending.set(r.approval_id, r);
    if (r.kind === "approval_decided") pending.delete(r.approval_id);
    if (["approval_requested", "approval_decided"].includes(r.kind)) renderApprovals();
    clearTimeout(refresh);
    refresh = setTimeout(() => {
      loadSummary();
      if (!attempts.length) lanesBox.replaceChildren(lanes(records, Date.now(), names));
    }, 150);
  }

  const workerPick = el("select", { id: "move-to" });
  const budget = el("input", { type: "number", min: 1, value: 10, id: "more-steps", title: "more steps" });
  const pr = el("input", { type: "checkbox", id: "deliver-pr" });
  actions.append(
    workerPick, el("button", { type: "button", id: "move", onclick: () => act("move", () => api("POST", "/api/tasks/" + id + "/move", { to: workerPick.value })) }, "Move"),
    el("button", { type: "button", id: "cancel", onclick: () => act("cancel", () => api("POST", "/api/tasks/" + id + "/cancel")) }, "Cancel"),
    budget, el("button", { type: "button", id: "resume", onclick: () => act("resume", () => api("POST", "/api/tasks/" + id + "/resume", { budget: { steps: Number(budget.value) || 0 } })) }, "Resume with more steps"),
    el("label", {}, pr, " pull request"), el("button", { type: "button", id: "deliver", onclick: () => act("deliver", async () => { const d = await api("POST", "/api/tasks/" + id + "/deliver", { pull_request: pr.checked }); banner("delivered " + d.branch + (d.pull_request_url ? " " + d.pull_request_url : "")); }) }, "Deliver"));
  if (state.session && state.session.role !== "operator") for (const b of actions.querySelectorAll("button")) b.disabled = true;
  // The workers' names first, so the timeline speaks of workers by name.
  const named = api("GET", "/api/workers").then(r => {
    for (const w of r.workers || []) names[w.id] = w.name || w.id;
    workerPick.replaceChildren(...(r.workers || []).map(w => el("option", { value: w.id }, (w.name || w.id) + (w.state === WORKER_STATES.indexOf("connected") ? "" : " (" + workerState(w.state) + ")"))));
  }).catch(() => {});

  loadSummary();
  named.then(() => {
    if (!timeline.isConnected) return; // the person went elsewhere meanwhile
    follow("/api/tasks/" + id + "/events", {
      record: e => add(timed(JSON.parse(e.data))),
      live: e => {
        const o = JSON.parse(e.data);
        if (o.kind === "live_output" && outputs.has(o.call_id) && !settled.has(o.call_id)) outputs.get(o.call_id).append(document.createTextNode(o.text));
      },
      broken: e => banner("a record cannot be read: " + JSON.parse(e.data).error),
    }, () => last);
  });
}

function workersView(view) {
  const body = el("tbody", {});
  view.append(el("h2", {}, "Workers"), el("table", {}, el("thead", {}, el("tr", {}, ["Id", "Name", "State", "Tasks", "Labels", "CPUs", "Memory", "Sandbox", "Last seen", ""].map(h => el("th", {}, h)))), body));
  const load = () => api("GET", "/api/workers").then(r => {
    body.replaceChildren(...(r.workers || []).map(w => {
      const c = w.capabilities || {};
      return el("tr", { "data-worker": w.id }, el("td", {}, w.id), el("td", {}, w.name), el("td", {}, w.link && w.link !== "steady" ? w.link : workerState(w.state) + (w.replica ? " via " + w.replica : "")),
        el("td", { class: "tasks" }, w.max_tasks ? (w.running_tasks || 0) + "/" + w.max_tasks : String(w.running_tasks || 0)),
        el("td", {}, Object.entries(w.labels || {}).map(([k, v]) => k + "=" + v).join(" ")),
        el("td", {}, String(c.cpus || "")), el("td", {}, Number(c.memory_bytes) ? (c.memory_bytes / 2 ** 30).toFixed(1) + " GiB" : ""),
        el("td", {}, (c.sandbox || []).join(", ")), el("td", {}, age(w.last_seen_unix_ms)),
        el("td", {}, el("button", { type: "button", class: "revoke", onclick: () => { if (confirm("Revoke " + w.id + "?")) act("revoke", async () => { await api("POST", "/api/workers/" + w.id + "/revoke"); load(); }); } }, "Revoke")));
    }));
  }).catch(e => banner(e.message));
  load();
}

function machinesView(view) {
  const body = el("tbody", {});
  view.append(el("h2", {}, "Machines"), el("table", {}, el("thead", {}, el("tr", {}, ["Id", "Provider", "State", "Worker", "Task", "Cost", "Note", ""].map(h => el("th", {}, h)))), body));
  const load = () => api("GET", "/api/machines?all=true").then(r => {
    body.replaceChildren(...(r.machines || []).map(m => el("tr", { "data-machine": m.id }, el("td", {}, m.id), el("td", {}, m.provider), el("td", {}, m.state),
      el("td", {}, m.worker_id), el("td", {}, m.task_id), el("td", {}, money(m.cost_usd) + " (" + money(m.usd_per_hour) + "/h)"), el("td", {}, m.note),
      el("td", {}, ["released", "failed"].includes(m.state) ? "" : el("button", { type: "button", class: "release", onclick: () => act("release", async () => { await api("POST", "/api/machines/" + m.id + "/release"); load(); }) }, "Release")))));
  }).catch(e => banner(e.message));
  load();
}

function newView(view) {
  const f = (name, label, input) => [el("label", { for: name }, label), input || el("input", { id: name, name, type: "text" })];
  const form = el("form", { class: "new" },
    f("goal", "Goal", el("textarea", { id: "goal", name: "goal", rows: 4, required: true })),
    f("git_url", "Git repository (optional)"), f("dir", "Or a directory on the worker (optional)"),
    f("worker", "Worker (empty: any)"), f("model", "Model (empty: the configured default)"),
    f("permission", "Permission", el("select", { id: "permission", name: "permission" }, ["", "read-only", "ask", "auto", "full"].map(p => el("option", { value: p }, p || "default")))),
    f("check", "Acceptance check (a shell command; exit 0 means done)"),
    f("labels", "Required worker labels (k=v, comma-separated)"),
    f("steps", "Step budget (0: default)", el("input", { id: "steps", type: "number", min: 0, value: 0 })),
    f("usd", "Cost budget in USD (0: default)", el("input", { id: "usd", type: "number", min: 0, step: "0.01", value: 0 })),
    f("attempts", "Attempts (each on a worker of its own; the check picks the winner; 0: default)", el("input", { id: "attempts", type: "number", min: 0, max: 16, value: 0 })),
    f("pick", "Pick", el("select", { id: "pick", name: "pick" }, ["", "first", "smallest"].map(p => el("option", { value: p }, p || "default (first)")))),
    el("label", { class: "check" }, el("input", { type: "checkbox", id: "no_agents_md" }), " Leave out the repository's AGENTS.md (its instructions for agents)"),
    el("p", {}, el("button", { type: "submit" }, "Start")));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const v = n => form.querySelector("#" + n).value.trim();
    const labels = {};
    for (const kv of v("labels").split(",").map(s => s.trim()).filter(Boolean)) { const [k, ...rest] = kv.split("="); labels[k] = rest.join("="); }
    act("start", async () => {
      const r = await api("POST", "/api/tasks", {
        goal: v("goal"), git_url: v("git_url"), dir: v("dir"), worker: v("worker"), model: v("model"),
        permission: v("permission"), check: v("check"), require_labels: labels,
        budget: { steps: Number(v("steps")) || 0, usd: Number(v("usd")) || 0 },
        attempts: Number(v("attempts")) || 0, pick: v("pick"),
        no_agents_md: form.querySelector("#no_agents_md").checked,
      });
      location.hash = "#/task/" + r.task_id;
    });
  });
  view.append(el("h2", {}, "New task"), form);
}

// ------------------------------------------------------------------ start

async function start() {
  document.getElementById("logout").addEventListener("click", () => act("log out", async () => {
    await api("POST", "/api/logout");
    location.reload();
  }));
  try {
    state.session = await api("GET", "/api/session");
  } catch (e) {
    document.getElementById("view").replaceChildren(el("p", {}, "Not logged in: " + e.message),
      el("p", {}, "Run ", el("code", {}, "brain web login"), " on the brain's host and open the link it prints."));
    return;
  }
  document.getElementById("who").textContent = state.session.name + " (" + state.session.role + ")";
  if (state.session.role !== "operator") document.getElementById("nav-new").hidden = true;
  window.addEventListener("hashchange", route);
  route();
}

start();
