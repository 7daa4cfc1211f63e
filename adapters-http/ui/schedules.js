// The schedules page: every schedule with its next fire time and the
// outcome counts of its fire times, paused or resumed with one click.
// Fetched again every few seconds, so fires show without a reload.

import { api } from "./api.js";
import { fill, h, report, when } from "./dom.js";

const REFRESH_MS = 5000;
const root = () => document.getElementById("app");

function row(s, act) {
  const workflow = s.version ? `${s.workflow} v${s.version}` : s.workflow;
  const action = s.paused ? "resume" : "pause";
  return h("tr", { "data-schedule": s.name, "data-paused": String(s.paused) },
    h("td", {}, s.name),
    h("td", {}, h("a", { href: `/definitions/${encodeURIComponent(s.workflow)}` }, workflow)),
    h("td", { class: "mono" }, s.cron),
    h("td", {}, s.timezone),
    h("td", {}, s.overlap),
    h("td", { "data-next-fire": s.next_fire ?? "" }, s.paused ? "paused" : when(s.next_fire)),
    ["started", "skipped_overlap", "buffered", "missed"].map((o) =>
      h("td", { class: "num", "data-outcome": o }, String(s.fires[o]))),
    h("td", {}, h("button", { type: "button", "data-action": action, onclick: () => act(s.name, action) },
      s.paused ? "Resume" : "Pause")));
}

function table(items, act) {
  const head = ["Name", "Workflow", "Cron", "Time zone", "Overlap", "Next fire", "Started", "Skipped", "Buffered", "Missed", ""];
  return h("table", { class: "list", id: "schedules" },
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, items.map((s) => row(s, act))),
    items.length ? null : h("tbody", {}, h("tr", {}, h("td", { colspan: head.length, class: "muted" },
      "No schedules yet: flowforge schedules create, or POST /api/v1/schedules."))));
}

/** Every schedule, refreshed while the page is open. */
export function mount() {
  fill(root(), h("h1", {}, "Schedules"), h("p", { class: "muted" }, "Loading…"));
  let stopped = false;
  let timer = null;
  const load = () => {
    clearTimeout(timer);
    api("/schedules").then((list) => {
      if (stopped) return;
      fill(root(), h("h1", {}, "Schedules"),
        h("p", { class: "muted" }, "Each fire time ends as started, skipped (a run was still active), buffered or missed."),
        table(list.items, act));
      timer = setTimeout(load, REFRESH_MS);
    }).catch((e) => { if (!stopped) { report(e); timer = setTimeout(load, REFRESH_MS); } });
  };
  const act = (name, action) =>
    api(`/schedules/${encodeURIComponent(name)}/${action}`, { method: "POST", body: {} }).then(load).catch(report);
  load();
  return () => { stopped = true; clearTimeout(timer); };
}
