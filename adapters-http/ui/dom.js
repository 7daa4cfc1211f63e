// Small DOM and formatting helpers shared by the pages, and what each state
// looks like: an icon and a label beside the colour, never colour alone.

/** Builds an element: `h("a", {href: "/", class: "x", "data-k": "v", onclick: f}, "text", child)`. */
export function h(tag, attrs = {}, ...children) {
  const svg = tag.startsWith("svg:");
  const el = svg
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "text") el.textContent = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** The states of runs and tasks: icon, label, and whether they are over. */
export const STATES = {
  pending: { icon: "○", label: "pending" },
  ready: { icon: "◌", label: "ready" },
  running: { icon: "▶", label: "running" },
  retrying: { icon: "↻", label: "retrying" },
  succeeded: { icon: "✓", label: "succeeded" },
  failed: { icon: "✗", label: "failed" },
  cancelled: { icon: "⊘", label: "cancelled" },
  skipped: { icon: "↷", label: "skipped" },
  none: { icon: "–", label: "not run" },
  defined: { icon: "□", label: "task" },
};

export const TERMINAL = new Set(["succeeded", "failed", "cancelled", "skipped"]);

/** A state badge: icon and label, coloured by `data-state`. */
export function badge(state, reason) {
  const look = STATES[state] ?? { icon: "?", label: state };
  const label = state === "cancelled" && reason === "upstream_failed" ? "cancelled (upstream failed)"
    : state === "skipped" && reason ? `skipped (${reason.replace("_", " ")})` : look.label;
  return h("span", { class: "badge", "data-state": state, "data-reason": reason ?? undefined },
    h("span", { class: "icon", "aria-hidden": "true" }, look.icon), " ", label);
}

/** `2026-12-02 09:58:07.685` in the reader's time zone, or "—". */
export function when(text) {
  if (!text) return "—";
  const d = new Date(text);
  if (Number.isNaN(d.getTime())) return text;
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
    `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

/** How long from `from` to `to` (or to now, marked as still going). */
export function took(from, to) {
  if (!from) return "—";
  const ms = (to ? new Date(to) : new Date()) - new Date(from);
  const text = ms < 1000 ? `${Math.max(0, Math.round(ms))} ms`
    : ms < 60_000 ? `${(ms / 1000).toFixed(2)} s`
    : `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
  return to ? text : `${text}…`;
}

/** Pretty JSON for a `<pre>`. */
export function json(value) {
  return JSON.stringify(value, null, 2);
}

/** Replaces the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  for (const child of children.flat()) if (child) el.append(child);
  return el;
}

/** Goes to `path` inside the UI without reloading (app.js renders it). */
export function go(path) {
  history.pushState(null, "", path);
  window.dispatchEvent(new Event("ff:navigate"));
}

/** Shows `message` (text or an error) in the banner; `null` hides it. */
export function report(message) {
  const banner = document.getElementById("banner");
  if (!message) {
    banner.hidden = true;
    return;
  }
  const text = message.status
    ? `${message.message} (${message.code}, HTTP ${message.status})`
    : String(message.message ?? message);
  banner.textContent = text;
  banner.hidden = false;
}

/** Asks a yes/no question in the page's modal dialog. */
export function confirmed(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    document.getElementById("confirm-no").focus();
  });
}
