// The definitions pages: every published workflow, the versions of one, and
// one version's graph, fingerprint and JSON exactly as stored.

import { api } from "./api.js";
import { Dag } from "./dag.js";
import { fill, h, json, report, when } from "./dom.js";

const root = () => document.getElementById("app");

function table(items, head) {
  return h("table", { class: "list", id: "definitions" },
    h("thead", {}, h("tr", {}, ["Workflow", "Version", "Tasks", "Fingerprint", "Published"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, items.map((d) => h("tr", { "data-definition": `${d.name}@${d.version}` },
      h("td", {}, head ? h("a", { href: `/definitions/${encodeURIComponent(d.name)}` }, d.name) : d.name),
      h("td", {}, h("a", { href: `/definitions/${encodeURIComponent(d.name)}/versions/${d.version}` }, `v${d.version}`)),
      h("td", {}, String(d.tasks)),
      h("td", { class: "mono" }, d.fingerprint.slice(0, 16) + "…"),
      h("td", {}, when(d.created_at))))),
    items.length ? null : h("tbody", {}, h("tr", {}, h("td", { colspan: 5, class: "muted" },
      "Nothing published yet: POST /api/v1/definitions, or flowforge submit."))));
}

/** Every workflow, its latest version first. */
export function mountList() {
  fill(root(), h("h1", {}, "Definitions"), h("p", { class: "muted" }, "Loading…"));
  let stopped = false;
  api("/definitions").then((list) => {
    if (stopped) return;
    const latest = new Map();
    for (const d of list.items) if ((latest.get(d.name)?.version ?? 0) < d.version) latest.set(d.name, d);
    const items = [...latest.values()].sort((a, b) => a.name.localeCompare(b.name));
    fill(root(), h("h1", {}, "Definitions"), h("p", { class: "muted" }, "The latest version of each workflow."), table(items, true));
  }).catch(report);
  return () => { stopped = true; };
}

/** The versions of one workflow. */
export function mountVersions(name) {
  fill(root(), h("h1", {}, name), h("p", { class: "muted" }, "Loading…"));
  let stopped = false;
  api(`/definitions/${encodeURIComponent(name)}`).then((list) => {
    if (stopped) return;
    const items = [...list.items].sort((a, b) => b.version - a.version);
    fill(root(), h("h1", {}, name), h("p", {}, h("a", { href: `/?workflow=${encodeURIComponent(name)}` }, "Its runs")), table(items, false));
  }).catch(report);
  return () => { stopped = true; };
}

/** One version: its graph, fingerprint and the stored JSON. */
export function mountVersion(name, version) {
  fill(root(), h("h1", {}, `${name} v${version}`), h("p", { class: "muted" }, "Loading…"));
  let stopped = false;
  api(`/definitions/${encodeURIComponent(name)}/versions/${version}`).then((d) => {
    if (stopped) return;
    const box = h("div", { id: "dag", class: "dag" });
    fill(root(),
      h("h1", {}, name, " ", h("span", { class: "muted" }, `v${version}`)),
      d.definition.description ? h("p", {}, d.definition.description) : null,
      h("dl", { class: "facts" },
        h("dt", {}, "Fingerprint"), h("dd", { class: "mono", id: "fingerprint" }, d.fingerprint),
        h("dt", {}, "Published"), h("dd", {}, when(d.created_at)),
        h("dt", {}, "Levels"), h("dd", {}, String(d.levels.length)),
        h("dt", {}, "Runs"), h("dd", {}, h("a", { href: `/?workflow=${encodeURIComponent(name)}` }, "this workflow's runs"))),
      h("h2", {}, "Graph"), box,
      h("h2", {}, "Definition"), h("pre", { class: "json", id: "definition-json" }, json(d.definition)));
    const tasks = d.definition.tasks;
    const states = new Map(tasks.map((t) => [t.key, { state: "defined" }]));
    const detail = h("aside", { id: "task-panel", hidden: true });
    box.after(detail);
    new Dag(box, {
      levels: d.levels,
      tasks: tasks.filter((t) => !t.compensate_for),
      compensators: tasks.filter((t) => t.compensate_for),
      states,
      onSelect: (key) => {
        detail.hidden = false;
        fill(detail, h("h2", {}, key), h("pre", { class: "json" }, json(tasks.find((t) => t.key === key))));
      },
    });
    box.dataset.ready = "true";
  }).catch(report);
  return () => { stopped = true; };
}
