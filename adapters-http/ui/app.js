// The UI's entry point: routes the shareable URLs to their pages in the
// browser (history API, no reloads), asks for a token when the server
// wants one, and shows errors in one banner.

import { askTokenWith } from "./api.js";
import { go, report } from "./dom.js";
import * as runs from "./runs.js";
import * as run from "./run.js";
import * as definitions from "./definitions.js";
import * as schedules from "./schedules.js";

const ROUTES = [
  [/^\/$/, "runs", (m) => runs.mount(m)],
  [/^\/runs\/([^/]+)$/, "run", (m) => run.mount(decodeURIComponent(m[1]))],
  [/^\/definitions$/, "definitions", () => definitions.mountList()],
  [/^\/definitions\/([^/]+)$/, "definitions", (m) => definitions.mountVersions(decodeURIComponent(m[1]))],
  [/^\/definitions\/([^/]+)\/versions\/(\d+)$/, "definition",
    (m) => definitions.mountVersion(decodeURIComponent(m[1]), Number(m[2]))],
  [/^\/schedules$/, "schedules", () => schedules.mount()],
];

let unmount = null;

function render() {
  if (unmount) unmount();
  unmount = null;
  report(null);
  const path = location.pathname.replace(/\/+$/, "") || "/";
  for (const [pattern, page, mount] of ROUTES) {
    const m = path.match(pattern);
    if (!m) continue;
    document.body.dataset.page = page;
    for (const link of document.querySelectorAll("nav a")) {
      link.toggleAttribute("aria-current", link.dataset.nav === (page === "run" ? "runs" : page.replace(/^definition$/, "definitions")));
    }
    unmount = mount(m) ?? null;
    return;
  }
  document.body.dataset.page = "missing";
  document.getElementById("app").textContent = "No such page.";
}

function askToken(reason) {
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token-input");
  const error = document.getElementById("token-error");
  error.hidden = !reason || !sessionStorage.getItem("flowforge.token");
  error.textContent = reason ?? "";
  input.value = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(input.value.trim() || null), { once: true });
    dialog.showModal();
    input.focus();
  });
}

askTokenWith(askToken);

// Same-origin links route inside the page; modified clicks still open tabs.
document.addEventListener("click", (e) => {
  const a = e.target.closest("a[href]");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith("/api/") || a.target) return;
  e.preventDefault();
  go(url.pathname + url.search);
});
window.addEventListener("popstate", render);
window.addEventListener("ff:navigate", render);
render();
