// Searchsmith trajectory viewer: plain JavaScript, no build step, nothing fetched but this
// service's own /v1/search. Every text from the corpus or the model is set as textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

const fmt = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "–");

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

// -- reading trajectories ----------------------------------------------------------------------

// A file holds one trajectory (JSON), a search response with one (`trajectory`), a list, or
// JSONL with one per line (`searchsmith search --save`, a benchmark's trajectories/*.jsonl).
function parseTrajectories(text) {
  const found = [];
  const take = (value) => {
    if (Array.isArray(value)) value.forEach(take);
    else if (value && Array.isArray(value.turns)) found.push(value);
    else if (value && value.trajectory && Array.isArray(value.trajectory.turns)) found.push(value.trajectory);
  };
  try {
    take(JSON.parse(text));
  } catch (error) {
    text.split("\n").filter((line) => line.trim()).forEach((line, number) => {
      try { take(JSON.parse(line)); } catch (lineError) { throw new Error(`line ${number + 1} is not JSON: ${lineError.message}`); }
    });
  }
  if (!found.length) throw new Error("no trajectory in this file (expected the trajectory schema: question, turns, final_ranking)");
  return found;
}

// The text a tool call returned, as the model first saw it: the first later view that holds the
// call's result (later views may show it pruned).
function toolResults(trajectory) {
  const results = new Map();
  for (const turn of trajectory.turns || []) {
    for (const message of turn.view_messages || []) {
      if (message.role === "tool" && message.tool_call_id && !results.has(message.tool_call_id)) {
        results.set(message.tool_call_id, typeof message.content === "string" ? message.content : JSON.stringify(message.content, null, 2));
      }
    }
  }
  return results;
}

function argumentsText(call) {
  const args = call.arguments || {};
  const parts = Object.entries(args).map(([name, value]) => {
    let shown = typeof value === "string" ? JSON.stringify(value) : JSON.stringify(value);
    if (shown.length > 160) shown = shown.slice(0, 157) + "…";
    return `${name}=${shown}`;
  });
  return parts.length ? parts.join(", ") : (call.raw_arguments || "");
}

// -- rendering -----------------------------------------------------------------------------

function renderDocuments(documents) {
  const list = $("documents");
  list.replaceChildren();
  if (!documents.length) list.append(el("li", { class: "empty" }, "(no documents)"));
  for (const doc of documents) {
    list.append(el("li", { class: "doc" },
      el("span", { class: "doc-title" }, doc.title || doc.doc_id), " ",
      el("span", { class: "doc-id" }, `[${doc.doc_id}]`),
      doc.justification ? el("span", { class: "justification" }, doc.justification) : null));
  }
}

function renderChart(trajectory) {
  const config = trajectory.config || {};
  const budget = config.token_budget || 0;
  const points = (trajectory.turns || []).map((turn) => turn.prompt_tokens || 0);
  const last = (trajectory.turns || []).slice(-1)[0];
  if (last && last.view_token_usage) points.push(last.view_token_usage);
  const box = $("chart");
  box.replaceChildren();
  if (!points.length) { box.append(el("p", { class: "summary" }, "(no turns)")); return; }
  const width = 520, height = 220, left = 56, right = 12, top = 12, bottom = 30;
  const top_value = Math.max(budget, ...points, 1);
  const x = (i) => left + (points.length === 1 ? 0 : (i * (width - left - right)) / (points.length - 1));
  const y = (v) => top + (height - top - bottom) * (1 - v / top_value);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "token usage over turns" });
  chart.append(svg("line", { x1: left, y1: y(0), x2: width - right, y2: y(0), stroke: "#d8dce4" }));
  const rule = (value, cls, label) => {
    if (!value) return;
    chart.append(svg("line", { class: cls, x1: left, y1: y(value), x2: width - right, y2: y(value) }));
    chart.append(svg("text", { x: width - right, y: y(value) - 3, "text-anchor": "end" }, `${label} ${fmt(value)}`));
  };
  rule(budget, "budget", "budget");
  if (budget && config.hard_cutoff) rule(Math.round(budget * config.hard_cutoff), "hard", "hard cutoff");
  if (budget && config.soft_threshold) rule(Math.round(budget * config.soft_threshold), "soft", "soft threshold");
  chart.append(svg("polyline", { class: "usage", points: points.map((v, i) => `${x(i)},${y(v)}`).join(" ") }));
  points.forEach((v, i) => {
    const dot = svg("circle", { cx: x(i), cy: y(v), r: 3.5 });
    dot.append(svg("title", {}, `${i < trajectory.turns.length ? `turn ${i + 1}` : "after the last turn"}: ${fmt(v)} tokens`));
    chart.append(dot);
    chart.append(svg("text", { x: x(i), y: height - bottom + 16, "text-anchor": "middle" }, i < trajectory.turns.length ? String(i + 1) : "end"));
  });
  chart.append(svg("text", { x: 4, y: y(top_value) + 4 }, fmt(top_value)));
  chart.append(svg("text", { x: 4, y: y(0) }, "0"));
  box.append(chart);
}

function renderTurns(trajectory) {
  const results = toolResults(trajectory);
  const box = $("turns");
  box.replaceChildren();
  (trajectory.turns || []).forEach((turn, position) => {
    const flags = [];
    if (turn.hint_shown) flags.push("hint shown");
    if (turn.past_hard_cutoff) flags.push("past hard cutoff");
    if (turn.forced_final) flags.push("asked for the answer");
    const head = el("div", { class: "turn-head" },
      el("span", {}, `Turn ${position + 1}`, ...flags.map((flag) => el("span", { class: "flag" }, flag))),
      el("span", { class: "tokens" }, `view ${fmt(turn.prompt_tokens)} tokens → ${fmt(turn.view_token_usage)} after; reply ${fmt(turn.completion_tokens)} tokens`));
    const card = el("div", { class: "turn", "data-turn": String(position + 1) }, head);
    if (turn.completion && turn.completion.trim()) card.append(el("div", { class: "assistant" }, turn.completion.trim()));
    if (turn.policy_error) card.append(el("div", { class: "policy-error" }, `policy error: ${turn.policy_error}`));
    for (const call of turn.tool_calls || []) {
      const chunks = (call.result_chunk_ids || []).length, docs = new Set(call.result_doc_ids || []).size;
      let meta = call.name === "prune_chunks" ? `${(call.pruned_chunk_ids || []).length} pruned` : `${chunks} chunks from ${docs} documents, ${fmt(call.tokens)} tokens`;
      if (call.rejected) meta = "rejected (past the hard cutoff)";
      const summary = el("summary", {}, el("span", { class: "call-name" }, call.name), "(", el("span", { class: "call-args" }, argumentsText(call)), ")",
        el("span", { class: "call-meta" }, meta), call.error ? el("span", { class: "call-meta" }, ` error: ${call.error}`) : null);
      const text = results.has(call.id) ? results.get(call.id) : "(the result is in no recorded view: the episode ended after this turn)";
      card.append(el("details", { class: "call" + (call.error ? " error" : "") }, summary, el("pre", {}, text)));
    }
    if ((turn.pruned_ids || []).length) {
      const docs = trajectory.chunk_docs || {};
      const names = turn.pruned_ids.map((id) => el("code", {}, docs[id] ? `${id} (${docs[id]})` : id));
      const line = el("div", { class: "pruned" }, `pruned ${turn.pruned_ids.length}: `);
      names.forEach((name, i) => { if (i) line.append(", "); line.append(name); });
      card.append(line);
    }
    box.append(card);
  });
  const lastTurn = (trajectory.turns || []).slice(-1)[0];
  const repeated = lastTurn && (lastTurn.completion || "").trim() === (trajectory.final_text || "").trim();
  if (trajectory.final_text && trajectory.final_text.trim() && !repeated) {
    box.append(el("div", { class: "turn final" }, el("div", { class: "turn-head" }, el("span", {}, "Final answer")),
      el("div", { class: "assistant" }, trajectory.final_text.trim())));
  }
}

function render(trajectory, documents) {
  const turns = trajectory.turns || [];
  const calls = turns.reduce((n, turn) => n + (turn.tool_calls || []).length, 0);
  const pruned = new Set(turns.flatMap((turn) => turn.pruned_ids || [])).size;
  $("question").textContent = trajectory.question || "(no question)";
  $("summary").textContent = [`policy ${trajectory.policy || "?"}`, `${turns.length} turns`, `${calls} tool calls`,
    `peak ${fmt(trajectory.peak_tokens)} tokens`, `${pruned} pruned`, `stopped: ${trajectory.stop_reason || "?"}`,
    trajectory.error ? `error: ${trajectory.error}` : null].filter(Boolean).join(" · ");
  renderDocuments(documents || (trajectory.final_ranking || []));
  renderChart(trajectory);
  renderTurns(trajectory);
  $("result").hidden = false;
  $("result").dataset.turns = String(turns.length);
}

// -- actions -----------------------------------------------------------------------------------

async function search(event) {
  event.preventDefault();
  const button = $("search");
  const body = { customer: $("customer").value.trim(), query: $("query").value, k: Number($("k").value || 10), trajectory: true };
  button.disabled = true;
  setStatus("searching…");
  try {
    const response = await fetch("/v1/search", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${$("key").value.trim()}` },
      body: JSON.stringify(body),
    });
    const payload = await response.json().catch(() => ({ message: `HTTP ${response.status}` }));
    if (!response.ok) throw new Error(`${response.status}: ${payload.message || payload.error || "request failed"}`);
    $("pick").hidden = true;
    render(payload.trajectory || { question: body.query, turns: [], final_ranking: payload.documents }, payload.documents);
    setStatus(`answered by ${payload.policy}`);
  } catch (error) {
    setStatus(`search failed: ${error.message}`, true);
  } finally {
    button.disabled = false;
  }
}

async function openFile() {
  const file = $("file").files[0];
  if (!file) return;
  try {
    const trajectories = parseTrajectories(await file.text());
    const pick = $("pick");
    pick.replaceChildren(...trajectories.map((t, i) => el("option", { value: String(i) }, `${i + 1}. ${(t.question || "").slice(0, 90)} (${t.policy || "?"})`)));
    pick.hidden = trajectories.length < 2;
    pick.onchange = () => render(trajectories[Number(pick.value)]);
    render(trajectories[0]);
    setStatus(`${file.name}: ${trajectories.length} trajector${trajectories.length === 1 ? "y" : "ies"}`);
  } catch (error) {
    setStatus(`${file.name}: ${error.message}`, true);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("search-form").addEventListener("submit", search);
  $("file").addEventListener("change", openFile);
});
