"""Schemathesis hooks for .ci/schemathesis.sh.

`no_partial_write`: a refused request (any 4xx or 5xx answer) must change no
row. Before every call the hook takes a snapshot of the host's database (per
table: the row count and a hash of every row, read-only); the check compares
it with the database after a refused call and fails naming the tables that
changed. Leaving out, by design: the space-link audit table (D-008: every
act-as request, refused or not, is one audit row) - nothing else.

Background writes would be blamed on the next refused request, so: before
each call the hook waits until the database is quiet (two equal snapshots
in a row: a queued task firing or turn has finished), and a task the fuzzer
creates or resumes is paused at once (a cron task must not fire mid-run).
After a successful `DELETE /api/spaces/current` the fuzzed space is made
again, so the rest of the run still reaches the space routes.
"""

import hashlib
import json
import os
import sqlite3
import time
import urllib.request

import schemathesis

DB = os.environ["MERCURY_FUZZ_DB"]
URL = os.environ["MERCURY_FUZZ_URL"]
TOKEN = os.environ["MERCURY_FUZZ_TOKEN"]
SPACE = os.environ["MERCURY_FUZZ_SPACE"]

# Written on purpose for refused requests too (see the module's docstring).
AUDITED = {"space_link_audit"}

_before = {}


def snapshot():
    con = sqlite3.connect(f"file:{DB}?mode=ro", uri=True, timeout=30)
    try:
        tables = [
            name
            for (name,) in con.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
            if name not in AUDITED
        ]
        out = {}
        for name in tables:
            digest = hashlib.sha256()
            count = 0
            for row in con.execute(f'SELECT * FROM "{name}" ORDER BY rowid'):
                digest.update(repr(row).encode())
                count += 1
            out[name] = (count, digest.hexdigest())
        return out
    finally:
        con.close()


def quiet_snapshot(limit_s=20.0):
    """A snapshot once two taken 50 ms apart agree (or after `limit_s`)."""
    deadline = time.monotonic() + limit_s
    last = snapshot()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = snapshot()
        if now == last:
            return now
        last = now
    return last


def host_call(method, path, space, body=None):
    req = urllib.request.Request(
        f"{URL}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "content-type": "application/json",
            "x-mercury-space": space,
        },
        method=method,
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


@schemathesis.hook
def before_call(context, case, **kwargs):
    _before["rows"] = quiet_snapshot()


@schemathesis.hook
def after_call(context, case, response):
    if response.status_code >= 300:
        return
    method = case.method.upper()
    if method == "DELETE" and case.path == "/api/spaces/current":
        req = urllib.request.Request(
            f"{URL}/api/spaces",
            data=json.dumps({"id": SPACE}).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=30).read()
    elif method == "POST" and case.path in ("/api/tasks", "/api/tasks/{id}/resume"):
        task = (response.json() or {}).get("task") or {}
        if task.get("id") is not None and task.get("space_id"):
            host_call("POST", f"/api/tasks/{task['id']}/pause", task["space_id"])


@schemathesis.check
def no_partial_write(ctx, response, case):
    """A refused request changes no row."""
    if response.status_code < 400 or "rows" not in _before:
        return None
    after = snapshot()
    before = _before["rows"]
    changed = sorted(t for t in set(before) | set(after) if before.get(t) != after.get(t))
    if changed:
        raise AssertionError(
            f"{case.method} {case.path} answered {response.status_code} "
            f"but changed rows of: {', '.join(changed)}"
        )
    return None
