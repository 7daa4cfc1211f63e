// The UI's only way to the server: the public /api/v1 with the bearer token
// kept in this tab's session storage, problem documents turned into errors,
// and a run's event stream read over fetch (EventSource cannot send a token)
// that resumes with Last-Event-ID after a drop.

const KEY = "flowforge.token";

/** A failed call: the HTTP status and the problem document's fields. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail ?? problem?.title ?? `HTTP ${status}`);
    this.status = status;
    this.code = problem?.code ?? "http_error";
  }
}

let prompt = null;
let pending = null;

/** Sets how to ask the user for a token when the server answers 401. */
export function askTokenWith(ask) {
  prompt = ask;
}

function token() {
  return sessionStorage.getItem(KEY);
}

/** One prompt at a time, however many calls were refused. */
async function newToken(reason) {
  if (!prompt) return false;
  pending ??= prompt(reason).finally(() => { pending = null; });
  const given = await pending;
  if (!given) return false;
  sessionStorage.setItem(KEY, given);
  return true;
}

function headers(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: `Bearer ${t}` } : extra;
}

/** Calls `/api/v1{path}`; resolves to the JSON body or throws ApiError. */
export async function api(path, { method = "GET", body } = {}) {
  for (;;) {
    const init = { method, headers: headers({ Accept: "application/json" }) };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(`/api/v1${path}`, init);
    const text = await r.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = { detail: text.slice(0, 200) };
    }
    if (r.status === 401 && await newToken(data?.detail)) continue;
    if (!r.ok) throw new ApiError(r.status, data);
    return data;
  }
}

/**
 * Follows a run's event stream from after `lastSeq`. Calls
 * `onEvent(event)` for each transition, `onLive(bool)` when the connection
 * opens or drops, `onEnd()` once the run is over. Reconnects after a drop
 * (server restart, network) with Last-Event-ID, so no event is seen twice
 * or missed. Returns a function that stops it.
 */
export function follow(runId, lastSeq, { onEvent, onLive, onEnd }) {
  const stop = new AbortController();
  let after = lastSeq;
  let wait = 500;
  (async () => {
    while (!stop.signal.aborted) {
      let over = false;
      try {
        const h = headers({ Accept: "text/event-stream" });
        if (after > 0) h["Last-Event-ID"] = String(after);
        const r = await fetch(`/api/v1/runs/${encodeURIComponent(runId)}/events`, { headers: h, signal: stop.signal });
        if (r.status === 401 && await newToken()) continue;
        if (!r.ok) throw new ApiError(r.status, null);
        onLive(true);
        wait = 500;
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replaceAll("\r\n", "\n");
          let at;
          while ((at = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, at);
            buffer = buffer.slice(at + 2);
            let name = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) name = line.slice(6).trim();
              else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
            }
            if (name === "transition") {
              const event = JSON.parse(data.join("\n"));
              if (event.seq > after) {
                after = event.seq;
                onEvent(event);
              }
            } else if (name === "end") {
              over = true;
            }
          }
          if (over) break;
        }
      } catch (e) {
        if (stop.signal.aborted) return;
        if (e instanceof ApiError && e.status === 404) over = true;
      }
      if (over) {
        onLive(false);
        onEnd();
        return;
      }
      onLive(false);
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(wait * 2, 4000);
    }
  })();
  return () => stop.abort();
}
