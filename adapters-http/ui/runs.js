// The runs page: newest first, filtered by state and workflow, keyset
// "load more", and live — the first page is fetched again every few
// seconds, so new runs and state changes appear without a reload.

import { api } from "./api.js";
import { badge, fill, h, report, took, when } from "./dom.js";

const REFRESH_MS = 3000;
const PAGE = 50;

export function mount() {
  const params = new URLSearchParams(location.search);
  const filter = { state: params.get("state") ?? "", workflow: params.get("workflow") ?? "" };
  const rows = new Map();
  let cursor = null;
  let stopped = false;

  const stateSelect = h("select", { id: "filter-state", name: "state" },
    h("option", { value: "" }, "any state"),
    ["pending", "running", "succeeded", "failed", "cancelled"].map((s) =>
      h("option", { value: s, selected: s === filter.state }, s)));
  const workflowSelect = h("select", { id: "filter-workflow", name: "workflow" },
    h("option", { value: "" }, "any workflow"));
  const body = h("tbody");
  const more = h("button", { id: "load-more", type: "button", hidden: true }, "Load more");
  const count = h("span", { class: "muted", id: "run-count" });
  const root = document.getElementById("app");
  fill(root,
    h("h1", {}, "Runs"),
    h("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
      h("label", { for: "filter-state" }, "State"), stateSelect,
      h("label", { for: "filter-workflow" }, "Workflow"), workflowSelect, count),
    h("table", { id: "runs", class: "list" },
      h("thead", {}, h("tr", {},
        ["Run", "Workflow", "Version", "State", "Created", "Duration"].map((c) => h("th", { scope: "col" }, c)))),
      body),
    more);

  const query = (after) => {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (filter.state) q.append("state", filter.state);
    if (filter.workflow) q.append("workflow", filter.workflow);
    if (after) q.set("cursor", after);
    return `/runs?${q}`;
  };

  const draw = () => {
    const sorted = [...rows.values()].sort((a, b) =>
      b.created_at.localeCompare(a.created_at) || b.id.localeCompare(a.id));
    fill(body, sorted.map((r) => h("tr", { "data-run-id": r.id, "data-state": r.state },
      h("td", {}, h("a", { href: `/runs/${r.id}`, class: "mono" }, r.id.slice(0, 13) + "…")),
      h("td", {}, r.workflow),
      h("td", {}, String(r.version)),
      h("td", {}, badge(r.state)),
      h("td", {}, when(r.created_at)),
      h("td", {}, took(r.started_at, r.finished_at)))));
    if (sorted.length === 0) body.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No runs yet.")));
    count.textContent = `${sorted.length} shown`;
    more.hidden = !cursor;
  };

  const load = async (after) => {
    const page = await api(query(after));
    if (stopped) return;
    for (const r of page.items) rows.set(r.id, r);
    if (!after || after === cursor) cursor = page.next_cursor;
    draw();
  };

  const restart = () => {
    const q = new URLSearchParams();
    if (filter.state) q.set("state", filter.state);
    if (filter.workflow) q.set("workflow", filter.workflow);
    history.replaceState(null, "", q.size ? `/?${q}` : "/");
    rows.clear();
    cursor = null;
    load(null).catch(report);
  };
  stateSelect.addEventListener("change", () => { filter.state = stateSelect.value; restart(); });
  workflowSelect.addEventListener("change", () => { filter.workflow = workflowSelect.value; restart(); });
  more.addEventListener("click", () => load(cursor).catch(report));

  api("/definitions").then((list) => {
    const names = [...new Set(list.items.map((d) => d.name))].sort();
    if (filter.workflow && !names.includes(filter.workflow)) names.unshift(filter.workflow);
    for (const name of names) {
      workflowSelect.append(h("option", { value: name, selected: name === filter.workflow }, name));
    }
  }).catch(report);
  // The first page again: new runs appear and known ones change state.
  const tick = async () => {
    if (stopped) return;
    try {
      const page = await api(query(null));
      if (stopped) return;
      for (const r of page.items) rows.set(r.id, r);
      if (rows.size <= page.items.length) cursor = page.next_cursor;
      draw();
    } catch (e) {
      report(e);
    }
    timer = setTimeout(tick, REFRESH_MS);
  };
  let timer = setTimeout(tick, REFRESH_MS);
  load(null).catch(report);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
