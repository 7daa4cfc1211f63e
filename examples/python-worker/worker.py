#!/usr/bin/env python3
"""A FlowForge remote worker in plain Python (standard library only).

It serves the task type `py.square`: claims task runs over the server's
remote-worker API, runs them in a thread pool, heartbeats their leases and
posts their outcomes. See README.md beside it.
"""
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

API = os.environ.get("FLOWFORGE_URL", "http://127.0.0.1:8080").rstrip("/") + "/api/v1/worker"
TOKEN = os.environ.get("FLOWFORGE_TOKEN", "")
WORKER = os.environ.get("WORKER_ID") or f"py-{socket.gethostname()}-{os.getpid()}"
CONCURRENCY = int(os.environ.get("CONCURRENCY", "4"))
HANG_ON = os.environ.get("HANG_ON")  # test hook: hang on this task key

stopping = threading.Event()  # set by SIGTERM/SIGINT: claim no more
finished = threading.Event()  # set when an outcome waits to be posted
lock = threading.Lock()
held = {}  # task_run_id -> claim, from the claim until its outcome is posted
done = []  # outcomes not posted yet
post_lock = threading.Lock()


def log(message):
    print(f"[{WORKER}] {message}", file=sys.stderr, flush=True)


def call(path, body, timeout=30):
    request = urllib.request.Request(API + path, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def beat(claims, progress=None):
    """Renews the leases of `claims`. A lease is the server's proof that we
    are alive: unrenewed, it expires and the task is given to another
    worker. Anything but `held` means stop; the claim keeps the status."""
    leases = [{"task_run_id": c["task_run_id"], "token": c["token"]} for c in claims]
    if progress is not None:
        for lease in leases:
            lease["progress"] = progress
    for claim, lease in zip(claims, call("/heartbeats", {"worker": WORKER, "leases": leases})["leases"]):
        if lease["status"] != "held" and claim["status"] == "held":
            claim["status"] = lease["status"]
            if not claim.get("ended"):  # (an ended one's outcome was just stored)
                log(f"{claim['task_key']}: lease {lease['status']}, stopping")


def heartbeats():
    while True:
        with lock:
            claims = [c for c in held.values() if c["status"] == "held"]
        try:
            if claims:
                beat(claims)
        except (urllib.error.URLError, OSError) as e:
            log(f"heartbeat failed: {e}")  # retried next period; the lease is longer
        time.sleep(min([c["lease_seconds"] for c in claims] or [3]) / 3)


def square(claim):
    config, run_input = claim["config"], claim["run_input"]
    x = config.get("x", run_input.get("x") if isinstance(run_input, dict) else None)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        # No other attempt will find a number here: a permanent failure.
        return {"outcome": "failed", "error": f"x must be a number, got {x!r}", "retryable": False}
    return {"outcome": "succeeded", "output": {"square": x * x}}


def run(claim):
    key = claim["task_key"]
    try:  # progress goes with a heartbeat, which also checks the lease at once
        beat([claim], progress={"stage": "computing"})
    except (urllib.error.URLError, OSError) as e:
        log(f"{key}: progress not reported: {e}")
    if HANG_ON == key:  # never ends; the test SIGKILLs us and the lease runs out
        log(f"{key} (task run {claim['task_run_id']}, token {claim['token']}): hanging, as HANG_ON asks")
        while True:
            time.sleep(1)
    outcome = square(claim)
    if claim["status"] == "cancel_requested":
        outcome = {"outcome": "cancelled"}
    log(f"{key} (task run {claim['task_run_id']}, attempt {claim['attempt']}): {outcome['outcome']}")
    with lock:
        if claim["status"] in ("lost", "timed_out"):
            del held[claim["task_run_id"]]  # another attempt owns it: the outcome would be refused
            return
        claim["ended"] = True
        done.append({"task_run_id": claim["task_run_id"], "run_id": claim["run_id"],
                     "token": claim["token"], **outcome})
    finished.set()


def flush():
    """Posts every outcome waiting. Each carries its claim's fencing token,
    so an outcome of an attempt that lost its lease (it was reaped and
    retried elsewhere) is refused instead of overwriting the newer one."""
    with post_lock:
        with lock:
            batch = done[:]
            done.clear()
        if not batch:
            return
        try:
            for result in call("/results", {"worker": WORKER, "results": batch})["results"]:
                if result["status"] != "recorded":
                    log(f"task run {result['task_run_id']}: {result['status']}, discarded")
        except urllib.error.HTTPError as e:  # 409 stale_token: every lease was lost
            log(f"results not stored ({e.code}): {e.read().decode(errors='replace')}")
        except (urllib.error.URLError, OSError) as e:
            log(f"posting results failed: {e}; retrying")
            with lock:
                done[:0] = batch
            return
        with lock:
            for result in batch:
                held.pop(result["task_run_id"], None)


def reporter():
    while True:
        finished.wait(1)
        finished.clear()
        flush()


def main():
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    threading.Thread(target=heartbeats, daemon=True).start()
    threading.Thread(target=reporter, daemon=True).start()
    log(f"serving py.square at {API} with {CONCURRENCY} slots")
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        while not stopping.is_set():
            with lock:
                free = CONCURRENCY - len(held)
            if free <= 0:
                stopping.wait(0.1)
                continue
            try:  # a long poll: answers as soon as work is ready, or after 10 s
                claims = call("/claims", {"worker": WORKER, "task_types": ["py.square"],
                                          "max": free, "wait_seconds": 10}, timeout=40)["claims"]
            except urllib.error.HTTPError as e:
                log(f"claim refused ({e.code}): {e.read().decode(errors='replace')}")
                if e.code in (401, 403, 422):
                    return 2  # a bad token or request: retrying will not help
                stopping.wait(2)
                continue
            except (urllib.error.URLError, OSError) as e:
                log(f"claim failed: {e}")
                stopping.wait(2)
                continue
            for claim in claims:  # claimed even if we are stopping now: run them
                claim["status"] = "held"
                with lock:
                    held[claim["task_run_id"]] = claim
                pool.submit(run, claim)
        log("stopping: finishing the tasks in flight")
    for _ in range(10):  # every task has ended; post what is left
        flush()
        with lock:
            if not held:
                break
        time.sleep(1)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
