// The review page: one (query, document) at a time, graded by keys or buttons. Everything shown is set with
// textContent or attributes, never innerHTML with data (document fields come from an untrusted catalog).
"use strict";

const params = new URLSearchParams(location.search);
if (params.has("token")) {  // keep the token for this tab only, and out of the address bar and history
  sessionStorage.setItem("ubiReviewToken", params.get("token"));
  params.delete("token");
  history.replaceState(null, "", location.pathname + (params.toString() ? "?" + params : ""));
}
const state = { assessor: (params.get("assessor") || "").trim(), item: null, config: null, busy: false };
const $ = (id) => document.getElementById(id);

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

async function api(method, path, body) {
  const headers = { "accept": "application/json" };
  const token = sessionStorage.getItem("ubiReviewToken");
  if (token) headers["x-review-token"] = token;
  if (body !== undefined) headers["content-type"] = "application/json";
  const resp = await fetch("/review/api/" + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await resp.json().catch(() => ({ message: resp.statusText }));
  if (!resp.ok) throw new Error(data.message || (data.detail && JSON.stringify(data.detail)) || resp.statusText);
  return data;
}

function showError(err) {
  $("error").textContent = err ? String(err.message || err) : "";
  $("error").hidden = !err;
}

function fmt(x) {
  if (x === null || x === undefined) return "-";
  return typeof x === "number" && !Number.isInteger(x) ? x.toFixed(3) : String(x);
}

function render(view) {
  state.item = view.item;
  const p = view.progress;
  $("progress").textContent = `graded ${p.graded}, skipped ${p.skipped}, left ${p.left} of ${p.pairs} pairs`;
  $("undo").disabled = !view.can_undo;
  $("done").hidden = !!view.item;
  $("grade-view").hidden = !view.item || !$("tab-grade").classList.contains("active");
  if (!view.item) return;
  const it = view.item;
  $("query").textContent = it.query;
  $("reason").textContent = `#${it.position + 1} of ${it.of}: ${it.reason}`;
  const doc = it.doc || {};
  $("doc-title").textContent = doc.title || it.doc_id;
  $("doc-id").textContent = it.doc_id;
  $("doc-description").textContent = doc.description || "";
  if (doc.url) { $("doc-url").href = doc.url; $("doc-url").hidden = false; } else { $("doc-url").hidden = true; $("doc-url").removeAttribute("href"); }
  if (doc.image) { $("doc-image").src = doc.image; $("doc-image").hidden = false; } else { $("doc-image").hidden = true; $("doc-image").removeAttribute("src"); }
  const tbody = $("evidence").querySelector("tbody");
  tbody.replaceChildren();
  if (it.evidence) {
    for (const e of it.evidence) {
      const tr = el("tr");
      const interval = e.ci_low === null ? "-" : `${fmt(e.ci_low)} – ${fmt(e.ci_high)}`;
      for (const v of [e.source, fmt(e.score), interval, fmt(e.impressions), fmt(e.clicks), fmt(e.sessions), fmt(e.grade)]) tr.append(el("td", v));
      tbody.append(tr);
    }
  }
  $("evidence").hidden = !it.evidence;
  $("your-grade").hidden = !it.your_grade;
  $("your-grade").textContent = it.your_grade ? `You graded this pair ${it.your_grade.grade}` + (it.your_grade.note ? ` (${it.your_grade.note})` : "") + "; a new grade replaces it." : "";
  $("note").value = "";
}

async function act(method, path, body) {
  if (state.busy) return;
  state.busy = true;
  try { render(await api(method, path, body)); showError(null); } catch (err) { showError(err); } finally { state.busy = false; }
}

function grade(g) {
  if (!state.item) return;
  act("POST", "grade", { assessor: state.assessor, query: state.item.query, doc_id: state.item.doc_id, grade: g, note: $("note").value });
}
function skip() {
  if (state.item) act("POST", "skip", { assessor: state.assessor, query: state.item.query, doc_id: state.item.doc_id });
}
function undo() { act("POST", "undo", { assessor: state.assessor }); }

function tab(name) {
  for (const t of ["grade", "disagreements", "progress"]) {
    $("tab-" + t).classList.toggle("active", t === name);
    const view = t === "grade" ? $("grade-view") : $(t + "-view");
    view.hidden = t !== name || (t === "grade" && !state.item);
  }
  $("done").hidden = name !== "grade" || !!state.item;
  if (name === "disagreements") loadDisagreements().catch(showError);
  if (name === "progress") loadProgress().catch(showError);
}

async function loadDisagreements() {
  const rows = await api("GET", "disagreements");
  const tbody = $("disagreements").querySelector("tbody");
  tbody.replaceChildren();
  for (const d of rows) {
    const tr = el("tr");
    tr.append(el("td", d.query), el("td", d.doc_id), el("td", d.spread));
    const list = el("td");
    for (const g of d.grades) list.append(el("div", `${g.assessor || "(unnamed)"}: ${g.grade}` + (g.note ? ` (${g.note})` : "")));
    const cell = el("td");
    if (d.in_queue) {
      const b = el("button", "grade it", { type: "button" });
      b.addEventListener("click", () => {
        const q = new URLSearchParams({ assessor: state.assessor, query: d.query, doc_id: d.doc_id });
        tab("grade");
        act("GET", "pair?" + q);
      });
      cell.append(b);
    }
    tr.append(list, cell);
    tbody.append(tr);
  }
  if (!rows.length) {
    const tr = el("tr");
    tr.append(el("td", "no disagreements yet", { colspan: "5" }));
    tbody.append(tr);
  }
}

async function loadProgress() {
  const rows = await api("GET", "progress");
  const tbody = $("progress-table").querySelector("tbody");
  tbody.replaceChildren();
  for (const r of rows) {
    const tr = el("tr");
    for (const v of [r.assessor, r.graded, r.skipped, r.left]) tr.append(el("td", v));
    tbody.append(tr);
  }
}

async function start() {
  $("who").textContent = state.assessor;
  try {
    state.config = await api("GET", "config");
    const c = state.config;
    $("rubric").textContent = c.rubric.text;
    $("rubric-version").textContent = c.rubric.version;
    $("key-max").textContent = String(c.grade_max);
    const box = $("grades");
    box.replaceChildren();
    for (let g = 0; g <= c.grade_max; g++) {
      const b = el("button", String(g), { type: "button", id: "grade-" + g, title: "key " + g });
      b.addEventListener("click", () => grade(g));
      box.append(b);
    }
    render(await api("GET", "next?" + new URLSearchParams({ assessor: state.assessor })));
    showError(null);
  } catch (err) { showError(err); }
}

document.addEventListener("keydown", (ev) => {
  if (!state.assessor || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.target instanceof HTMLTextAreaElement || ev.target instanceof HTMLInputElement) return;
  if (!$("tab-grade").classList.contains("active")) return;
  const max = state.config ? state.config.grade_max : 3;
  if (/^[0-9]$/.test(ev.key) && Number(ev.key) <= max) { ev.preventDefault(); grade(Number(ev.key)); }
  else if (ev.key === "s") { ev.preventDefault(); skip(); }
  else if (ev.key === "u") { ev.preventDefault(); undo(); }
});

window.addEventListener("DOMContentLoaded", () => {
  $("skip").addEventListener("click", skip);
  $("undo").addEventListener("click", undo);
  for (const t of ["grade", "disagreements", "progress"]) $("tab-" + t).addEventListener("click", () => tab(t));
  $("name-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.assessor = $("name-input").value.trim();
    if (!state.assessor) return;
    params.set("assessor", state.assessor);
    history.replaceState(null, "", location.pathname + "?" + params);
    $("name-form").hidden = true;
    start();
  });
  if (state.assessor) start(); else { $("name-form").hidden = false; $("name-input").focus(); }
});
