// A run's (or a definition's) graph: laid out from the dependency levels the
// server computes (level i is column i, left to right), every task a button
// coloured by state with an icon and a label, compensators in their own lane
// with a dashed arrow to what they undo. A level wider than WIDE is one
// group node with counts per state until it is clicked open, so a
// 10 000-task fan-out draws a handful of elements. State changes are
// batched into one repaint per animation frame.

import { STATES, h } from "./dom.js";

const WIDE = 24;
const W = 184;
const H = 46;
const GAP_X = 44;
const GAP_Y = 12;
const PAD = 12;
const LANE_GAP = 56;

/** Which state a group shows: the most pressing one among its tasks. */
const GROUP_ORDER = ["running", "retrying", "ready", "failed", "pending", "cancelled", "skipped", "succeeded", "none", "defined"];

export class Dag {
  /**
   * `levels`: arrays of task keys; `tasks`: `{key, depends_on}`;
   * `compensators`: `{key, compensate_for}`; `states`: key → `{state, reason}`
   * (reason: a cancel reason, or what holds a pending task back);
   * `onSelect(key)` when a task is opened.
   */
  constructor(container, { levels, tasks, compensators, states, onSelect }) {
    this.container = container;
    this.levels = levels;
    this.tasks = tasks;
    this.compensators = compensators;
    this.states = states;
    this.onSelect = onSelect;
    this.expanded = new Set();
    this.dirty = new Set();
    this.frame = 0;
    this.selected = null;
    this.levelOf = new Map();
    levels.forEach((level, i) => level.forEach((key) => this.levelOf.set(key, i)));
    container.addEventListener("keydown", (e) => this.key(e));
    this.draw();
  }

  /** The element id a task is drawn as: itself, or its level's group. */
  shownAs(key) {
    const level = this.levelOf.get(key);
    return level !== undefined && this.grouped(level) ? `group:${level}` : key;
  }

  grouped(level) {
    return this.levels[level].length > WIDE && !this.expanded.has(level);
  }

  draw() {
    this.columns = this.levels.map((level, i) => (this.grouped(i) ? [`group:${i}`] : [...level]));
    const tallest = Math.max(1, ...this.columns.map((c) => c.length));
    const mainHeight = tallest * (H + GAP_Y) - GAP_Y;
    this.at = new Map();
    this.columns.forEach((column, i) => {
      const top = PAD + (mainHeight - (column.length * (H + GAP_Y) - GAP_Y)) / 2;
      column.forEach((id, row) => this.at.set(id, { x: PAD + i * (W + GAP_X), y: top + row * (H + GAP_Y) }));
    });
    // The compensators' lane: each under the column of what it undoes.
    const laneRows = new Map();
    let height = PAD + mainHeight + PAD;
    for (const c of this.compensators) {
      const column = this.levelOf.get(c.compensate_for) ?? 0;
      const row = laneRows.get(column) ?? 0;
      laneRows.set(column, row + 1);
      const y = PAD + mainHeight + LANE_GAP + row * (H + GAP_Y);
      this.at.set(c.key, { x: PAD + column * (W + GAP_X), y });
      height = Math.max(height, y + H + PAD);
    }
    const width = PAD * 2 + Math.max(1, this.columns.length) * (W + GAP_X) - GAP_X;
    this.elements = new Map();
    const nodes = [];
    for (const [id, { x, y }] of this.at) {
      const el = id.startsWith("group:") ? this.groupNode(Number(id.slice(6))) : this.taskNode(id);
      el.style.left = `${x}px`;
      el.style.top = `${y}px`;
      el.dataset.id = id;
      this.elements.set(id, el);
      nodes.push(el);
    }
    const svg = h("svg:svg", { class: "edges", width, height, "aria-hidden": "true" },
      h("svg:defs", {},
        h("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
          h("svg:path", { d: "M0,0 L10,5 L0,10 z" }))),
      this.edges());
    const lane = this.compensators.length
      ? h("div", { class: "lane-label", "aria-hidden": "true" }, "compensators")
      : null;
    if (lane) lane.style.top = `${PAD + mainHeight + LANE_GAP / 2 - 9}px`;
    const canvas = h("div", { class: "canvas", role: "group", "aria-label": "Tasks by dependency level" }, svg, lane, nodes);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    this.container.replaceChildren(canvas);
    if (this.selected) this.mark(this.selected);
  }

  edges() {
    const seen = new Set();
    const paths = [];
    const link = (from, to, undo) => {
      const a = this.at.get(from);
      const b = this.at.get(to);
      const id = `${from}>${to}`;
      if (!a || !b || seen.has(id)) return;
      seen.add(id);
      let d;
      if (undo) {
        // Up from the compensator to what it undoes.
        d = `M${a.x + W / 2},${a.y} L${b.x + W / 2},${b.y + H}`;
      } else {
        const x1 = a.x + W;
        const y1 = a.y + H / 2;
        const x2 = b.x;
        const y2 = b.y + H / 2;
        const bend = (x2 - x1) / 2;
        d = `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`;
      }
      paths.push(h("svg:path", { d, class: undo ? "undo" : "dep", "marker-end": "url(#arrow)" }));
    };
    for (const t of this.tasks) {
      for (const dep of t.depends_on ?? []) link(this.shownAs(dep), this.shownAs(t.key), false);
    }
    for (const c of this.compensators) link(c.key, this.shownAs(c.compensate_for), true);
    return paths;
  }

  taskNode(key) {
    const el = h("button", { type: "button", class: "node", "data-task-key": key, title: key, onclick: () => this.select(key) },
      h("span", { class: "icon", "aria-hidden": "true" }),
      h("span", { class: "key" }, key),
      h("span", { class: "label" }));
    const compensates = this.compensators.find((c) => c.key === key)?.compensate_for;
    if (compensates) el.dataset.compensates = compensates;
    this.paint(el, key);
    return el;
  }

  groupNode(level) {
    const el = h("button", { type: "button", class: "node group", "data-group-level": level,
      "aria-expanded": "false", onclick: () => { this.expanded.add(level); this.draw(); this.elements.get(this.levels[level][0])?.focus(); } },
    h("span", { class: "icon", "aria-hidden": "true" }),
    h("span", { class: "key" }, `${this.levels[level].length} tasks`),
    h("span", { class: "label" }));
    this.paintGroup(el, level);
    return el;
  }

  paint(el, key) {
    const { state, reason } = this.states.get(key) ?? { state: "pending" };
    const look = STATES[state] ?? { icon: "?", label: state };
    el.dataset.state = state;
    if (reason) el.dataset.reason = reason;
    else delete el.dataset.reason;
    // A pending task's reason is what holds it back besides its
    // dependencies: `concurrency:<key>` (docs/design/concurrency.md).
    const label = state === "cancelled" && reason === "upstream_failed" ? "cancelled: upstream failed"
      : state === "skipped" && reason ? `skipped: ${reason.replace("_", " ")}`
      : state === "pending" && reason ? `waiting for ${reason}` : look.label;
    el.querySelector(".icon").textContent = look.icon;
    el.querySelector(".label").textContent = label;
    el.setAttribute("aria-label", `${key}: ${label}`);
  }

  paintGroup(el, level) {
    const counts = new Map();
    for (const key of this.levels[level]) {
      const s = this.states.get(key)?.state ?? "pending";
      counts.set(s, (counts.get(s) ?? 0) + 1);
    }
    const state = GROUP_ORDER.find((s) => counts.has(s)) ?? "pending";
    el.dataset.state = state;
    el.querySelector(".icon").textContent = STATES[state]?.icon ?? "?";
    const text = GROUP_ORDER.filter((s) => counts.has(s))
      .map((s) => `${STATES[s]?.icon ?? ""} ${counts.get(s)} ${STATES[s]?.label ?? s}`).join(" · ");
    el.querySelector(".label").textContent = text;
    el.setAttribute("aria-label", `${this.levels[level].length} tasks of level ${level + 1}: ${text}; open to show each`);
  }

  /** Records a task's new state; the element changes on the next frame. */
  set(key, state, reason) {
    this.states.set(key, { state, reason });
    this.dirty.add(this.shownAs(key));
    this.frame ||= requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.frame = 0;
    for (const id of this.dirty) {
      const el = this.elements.get(id);
      if (!el) continue;
      if (id.startsWith("group:")) this.paintGroup(el, Number(id.slice(6)));
      else this.paint(el, id);
    }
    this.dirty.clear();
  }

  select(key) {
    this.mark(key);
    this.onSelect(key);
  }

  mark(key) {
    this.elements.get(this.selected)?.removeAttribute("aria-pressed");
    this.selected = key;
    this.elements.get(key)?.setAttribute("aria-pressed", "true");
  }

  /** Arrow keys walk the graph: up and down a level, left and right across. */
  key(e) {
    const id = e.target?.dataset?.id;
    if (!id || !["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight"].includes(e.key)) return;
    const lane = this.compensators.map((c) => c.key);
    const columns = [...this.columns, lane];
    const col = columns.findIndex((c) => c.includes(id));
    if (col < 0) return;
    const row = columns[col].indexOf(id);
    let target;
    if (e.key === "ArrowUp" || e.key === "ArrowDown") {
      target = columns[col][row + (e.key === "ArrowUp" ? -1 : 1)];
    } else {
      const next = columns[col + (e.key === "ArrowLeft" ? -1 : 1)];
      if (next?.length) target = next[Math.min(row, next.length - 1)];
    }
    if (target) {
      e.preventDefault();
      this.elements.get(target)?.focus();
    }
  }
}
