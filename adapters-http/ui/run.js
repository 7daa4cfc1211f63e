// The run page: its header, the live DAG, a task's attempts, the timeline
// and the cancel button. It loads the run report and the definition's
// levels once, then follows the run's event stream (resuming after a drop)
// and reads the report again only when an event needs what events do not
// carry (why a task was cancelled) or when the run ends.

import { api, follow } from "./api.js";
import { Dag } from "./dag.js";
import { TERMINAL, badge, confirmed, fill, h, json, report, took, when } from "./dom.js";

export function mount(id) {
  const t0 = performance.now();
  const root = document.getElementById("app");
  const header = h("section", { id: "run-header", "aria-live": "polite" });
  const dagBox = h("div", { id: "dag", class: "dag", tabindex: "-1" });
  const panel = h("aside", { id: "task-panel", hidden: true, "aria-label": "Task" });
  const timeline = h("section", { id: "timeline", "aria-label": "Timeline" });
  const live = h("span", { id: "live", "data-live": "closed" }, "○ not live");
  fill(root, header, h("div", { class: "run-body" },
    h("section", { class: "graph", "aria-label": "Graph" }, h("h2", {}, "Graph ", live), dagBox), panel),
  h("h2", {}, "Timeline"), timeline);

  let run = null;
  let definition = null;
  let dag = null;
  let stop = null;
  let stopped = false;
  let open = null;
  const events = [];
  const timers = new Set();
  const later = (name, ms, f) => {
    if (timers.has(name)) return;
    timers.add(name);
    setTimeout(() => { timers.delete(name); if (!stopped) f(); }, ms);
  };

  const states = (r) => {
    const map = new Map();
    for (const t of r.tasks) map.set(t.key, { state: t.state, reason: t.cancel_reason ?? t.skip_reason ?? t.blocked_by ?? undefined });
    for (const c of r.compensations) map.set(c.key, { state: c.state });
    return map;
  };

  const drawHeader = () => {
    const active = !TERMINAL.has(run.state);
    header.dataset.runState = run.state;
    const cancel = active
      ? h("button", { id: "cancel-run", type: "button", class: "danger", onclick: cancelRun }, "Cancel run…")
      : null;
    const retry = run.state === "failed" || run.state === "cancelled"
      ? h("button", { id: "retry-run", type: "button", onclick: retryRun }, "Retry run…")
      : null;
    fill(header,
      h("div", { class: "title" },
        h("h1", {}, run.workflow.name, " ", h("span", { class: "muted" }, `v${run.workflow.version}`)),
        badge(run.state), cancel, retry),
      h("dl", { class: "facts" },
        h("dt", {}, "Run"), h("dd", { class: "mono" }, run.run_id),
        h("dt", {}, "Priority"), h("dd", { id: "run-priority" }, String(run.priority)),
        run.cancel_reason ? [h("dt", {}, "Cancelled by"), h("dd", { id: "run-cancel-reason" }, run.cancel_reason.replace("_", " "))] : null,
        h("dt", {}, "Definition"), h("dd", {}, h("a", { href: `/definitions/${encodeURIComponent(run.workflow.name)}/versions/${run.workflow.version}` },
          `${run.workflow.name} v${run.workflow.version}`)),
        h("dt", {}, "Started"), h("dd", {}, when(run.started_at)),
        h("dt", {}, "Finished"), h("dd", {}, when(run.finished_at)),
        h("dt", {}, "Duration"), h("dd", {}, took(run.started_at, run.finished_at))),
      h("details", {}, h("summary", {}, "Input"), h("pre", { class: "json" }, json(run.input))));
  };

  async function cancelRun() {
    if (!await confirmed(`Cancel run ${run.run_id}? Tasks not yet finished are cancelled and compensation runs.`)) return;
    try {
      await api(`/runs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
      report(null);
      const button = document.getElementById("cancel-run");
      if (button) {
        button.disabled = true;
        button.textContent = "Cancel requested";
      }
    } catch (e) {
      report(e);
    }
  }

  // The dry run comes first, so the confirmation names exactly the tasks
  // that will run again (docs/design/retry.md). A compensated run is
  // retried from its failed and cancelled tasks: the server then redoes
  // the compensated ones by rule, and the confirmation says so
  // (docs/design/retry.md#compensated-runs).
  async function retryRun() {
    try {
      const path = `/runs/${encodeURIComponent(id)}/retry`;
      let body = {};
      let plan;
      try {
        plan = await api(path, { method: "POST", body: { dry_run: true } });
      } catch (e) {
        if (e.code !== "run_compensated") throw e;
        const from = run.tasks.filter((t) => t.state === "failed" || t.state === "cancelled").map((t) => t.key);
        body = { from };
        plan = await api(path, { method: "POST", body: { from, dry_run: true } });
      }
      const list = plan.tasks.map((t) => `${t.key} (${t.from} → ${t.to})`).join(", ");
      const undone = body.from ? " The run was compensated, so the tasks its rollback undid run again too." : "";
      if (!await confirmed(`Retry run ${run.run_id} as generation ${plan.generation}? These tasks run again: ${list}.${undone} Every other task keeps its state and output.`)) return;
      await api(path, { method: "POST", body });
      // The run's stream ended with the run; the page starts a new one.
      location.reload();
    } catch (e) {
      report(e);
    }
  }

  const refresh = async () => {
    try {
      const fresh = await api(`/runs/${encodeURIComponent(id)}`);
      if (stopped) return;
      run = fresh;
      for (const [key, s] of states(fresh)) dag.set(key, s.state, s.reason);
      drawHeader();
      if (open) showTask(open);
    } catch (e) {
      report(e);
    }
  };

  const onEvent = (e) => {
    events.push(e);
    if (e.task) {
      dag.set(e.task, e.to, e.to === "cancelled" || e.to === "skipped" ? dag.states.get(e.task)?.reason : undefined);
      // Events do not say why a task was cancelled or skipped; the report does.
      if (e.to === "cancelled" || e.to === "skipped") later("refresh", 300, refresh);
      if (e.task === open) later("panel", 300, () => showTask(open));
    } else {
      run.state = e.to;
      if (e.to === "running") run.started_at ??= e.at;
      if (TERMINAL.has(e.to)) run.finished_at ??= e.at;
      drawHeader();
    }
    later("timeline", 500, drawTimeline);
  };

  const inputOf = (key) => {
    const task = definition.definition.tasks.find((t) => t.key === key);
    if (!task) return null;
    const outputs = new Map([...run.tasks, ...run.compensations].map((t) => [t.key, t.output]));
    const from = task.compensate_for ? [task.compensate_for] : (task.depends_on ?? []);
    return { inputs: Object.fromEntries(from.map((k) => [k, outputs.get(k) ?? null])), run_input: run.input };
  };

  async function showTask(key) {
    open = key;
    const task = run.tasks.find((t) => t.key === key) ?? run.compensations.find((t) => t.key === key);
    const defined = definition.definition.tasks.find((t) => t.key === key);
    panel.hidden = false;
    panel.dataset.taskKey = key;
    let attempts = [];
    try {
      attempts = task ? (await api(`/runs/${encodeURIComponent(id)}/tasks/${encodeURIComponent(key)}/attempts`)).items : [];
    } catch (e) {
      if (e.status !== 404) report(e);
    }
    if (stopped || open !== key) return;
    const state = dag.states.get(key) ?? { state: "pending" };
    const tabs = h("div", { role: "tablist", class: "tabs", "aria-label": "Attempts" });
    const panes = h("div", { class: "panes" });
    const pick = (n) => {
      for (const tab of tabs.children) {
        const on = Number(tab.dataset.attempt) === n;
        tab.setAttribute("aria-selected", String(on));
        tab.tabIndex = on ? 0 : -1;
      }
      for (const pane of panes.children) pane.hidden = Number(pane.dataset.attempt) !== n;
    };
    for (const a of attempts) {
      tabs.append(h("button", { type: "button", role: "tab", id: `tab-${a.attempt}`, "data-attempt": a.attempt,
        "aria-controls": `pane-${a.attempt}`, onclick: () => pick(a.attempt),
        onkeydown: (e) => {
          const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
          const next = step && attempts[attempts.indexOf(a) + step];
          if (next) { pick(next.attempt); document.getElementById(`tab-${next.attempt}`).focus(); }
        } }, `Attempt ${a.attempt} `, badge(a.state)));
      panes.append(h("div", { role: "tabpanel", id: `pane-${a.attempt}`, "data-attempt": a.attempt, "aria-labelledby": `tab-${a.attempt}` },
        h("dl", { class: "facts" },
          h("dt", {}, "State"), h("dd", {}, badge(a.state)),
          h("dt", {}, "Ready"), h("dd", {}, when(a.ready_at)),
          h("dt", {}, "Started"), h("dd", {}, when(a.started_at)),
          h("dt", {}, "Finished"), h("dd", {}, when(a.finished_at)),
          h("dt", {}, "Queued"), h("dd", {}, a.started_at ? took(a.ready_at, a.started_at) : "—"),
          h("dt", {}, "Ran"), h("dd", {}, took(a.started_at, a.finished_at)),
          h("dt", {}, "Worker"), h("dd", { class: "mono" }, a.worker ?? "—"),
          h("dt", {}, "Fencing token"), h("dd", {}, String(a.token))),
        a.error ? [h("h4", {}, "Error"), h("pre", { class: "error" }, a.error)] : null,
        h("h4", {}, "Output"), h("pre", { class: "json output" }, json(a.output))));
    }
    fill(panel,
      h("div", { class: "panel-head" },
        h("h2", {}, key),
        h("button", { type: "button", class: "close", "aria-label": "Close the task panel",
          onclick: () => { panel.hidden = true; open = null; dag.mark(null); } }, "×")),
      h("p", {}, badge(state.state, state.reason), " ",
        h("span", { class: "muted" }, defined?.task_type ?? ""),
        defined?.compensate_for ? h("span", { class: "muted" }, ` · undoes ${defined.compensate_for}`) : null,
        task?.priority !== undefined ? h("span", { class: "muted" }, ` · priority ${task.priority}`) : null),
      task?.blocked_by ? h("p", { class: "blocked", "data-blocked-by": task.blocked_by }, `Waiting for a slot: ${task.blocked_by}`) : null,
      attempts.length ? [tabs, panes] : h("p", { class: "muted" }, "No attempt yet."),
      h("details", {}, h("summary", {}, "Input (built from upstream outputs)"), h("pre", { class: "json" }, json(inputOf(key)))));
    if (attempts.length) pick(attempts[attempts.length - 1].attempt);
  }

  /** One bar per attempt: queued (ready → claim), then running. */
  function drawTimeline() {
    const byAttempt = new Map();
    for (const e of events) {
      if (!e.task || e.attempt === null) continue;
      const k = `${e.task}#${e.attempt}`;
      const a = byAttempt.get(k) ?? { key: e.task, attempt: e.attempt };
      if (e.to === "ready") a.ready ??= e.at;
      else if (e.to === "running") a.start = e.at;
      else if (["succeeded", "failed", "retrying", "cancelled"].includes(e.to) && a.start) {
        a.end = e.at;
        a.state = e.to;
      }
      byAttempt.set(k, a);
    }
    const bars = [...byAttempt.values()].filter((a) => a.start)
      .sort((a, b) => (a.ready ?? a.start).localeCompare(b.ready ?? b.start));
    if (!bars.length) {
      fill(timeline, h("p", { class: "muted" }, "No attempt has started yet."));
      return;
    }
    const LIMIT = 400;
    const shown = bars.slice(0, LIMIT);
    const ms = (t) => new Date(t).getTime();
    const now = Date.now();
    const start = Math.min(...shown.map((a) => ms(a.ready ?? a.start)));
    const end = Math.max(start + 1, ...shown.map((a) => (a.end ? ms(a.end) : now)));
    const LABEL = 220;
    const WIDTH = 760;
    const ROW = 18;
    const x = (t) => LABEL + ((t - start) / (end - start)) * WIDTH;
    const svg = h("svg:svg", { class: "gantt", width: LABEL + WIDTH + 10, height: shown.length * ROW + 24, role: "img",
      "aria-label": `Timeline of ${bars.length} attempts over ${took(new Date(start).toISOString(), new Date(end).toISOString())}` },
    shown.map((a, i) => {
      const y = i * ROW + 4;
      const ready = ms(a.ready ?? a.start);
      const begun = ms(a.start);
      const over = a.end ? ms(a.end) : now;
      return h("svg:g", { "data-task-key": a.key, "data-attempt": a.attempt },
        h("svg:text", { x: 4, y: y + 12, class: "bar-label" }, `${a.key} #${a.attempt}`),
        h("svg:rect", { x: x(ready), y, width: Math.max(1, x(begun) - x(ready)), height: ROW - 6, class: "queued" },
          h("svg:title", {}, `${a.key} #${a.attempt} queued ${begun - ready} ms`)),
        h("svg:rect", { x: x(begun), y, width: Math.max(2, x(over) - x(begun)), height: ROW - 6, class: "ran", "data-state": a.state ?? "running" },
          h("svg:title", {}, `${a.key} #${a.attempt} ${a.state ?? "running"} ${over - begun} ms`)));
    }),
    h("svg:text", { x: LABEL, y: shown.length * ROW + 18, class: "axis" }, "0"),
    h("svg:text", { x: LABEL + WIDTH, y: shown.length * ROW + 18, class: "axis", "text-anchor": "end" }, `${end - start} ms`));
    fill(timeline,
      h("p", { class: "legend" }, h("span", { class: "swatch queued" }), " queued (ready → claimed) ",
        h("span", { class: "swatch ran" }), " running, coloured by how the attempt ended"),
      svg,
      bars.length > LIMIT ? h("p", { class: "muted" }, `The first ${LIMIT} of ${bars.length} attempts are drawn.`) : null);
  }

  (async () => {
    try {
      run = await api(`/runs/${encodeURIComponent(id)}`);
      definition = await api(`/definitions/${encodeURIComponent(run.workflow.name)}/versions/${run.workflow.version}`);
    } catch (e) {
      fill(root, h("h1", {}, "Run ", h("span", { class: "mono" }, id)), h("p", { class: "error" }, e.message));
      document.body.dataset.page = "run-missing";
      return;
    }
    if (stopped) return;
    const all = definition.definition.tasks;
    const known = states(run);
    for (const c of all.filter((t) => t.compensate_for)) if (!known.has(c.key)) known.set(c.key, { state: "none" });
    dag = new Dag(dagBox, {
      levels: definition.levels,
      tasks: all.filter((t) => !t.compensate_for),
      compensators: all.filter((t) => t.compensate_for),
      states: known,
      onSelect: (key) => showTask(key).catch(report),
    });
    drawHeader();
    events.push(...run.events);
    drawTimeline();
    dagBox.dataset.ready = "true";
    // Time to interactive, since navigation and since this page began (the
    // browser test reads it; see BENCHMARKS.md).
    window.__flowforge = { readyAtMs: performance.now(), pageReadyMs: performance.now() - t0 };
    const last = events.reduce((m, e) => Math.max(m, e.seq), 0);
    if (TERMINAL.has(run.state)) {
      live.textContent = "○ finished";
    } else {
      stop = follow(id, last, {
        onEvent,
        onLive: (on) => {
          live.dataset.live = on ? "open" : "closed";
          live.textContent = on ? "● live" : "○ reconnecting…";
        },
        onEnd: () => {
          live.textContent = "○ finished";
          refresh();
        },
      });
    }
  })();
  return () => {
    stopped = true;
    if (stop) stop();
  };
}
