#!/usr/bin/env python3
"""An executor outside Django: it runs ``demo/thumbnail`` tasks through the HTTP API.

Only the standard library; any language that speaks HTTP could do the same
(docs/executors.md). ``manage.py demo`` starts it with the API's address and a token:

    TASKS_API_URL=http://127.0.0.1:8000/tasks TASKS_API_TOKEN=dtc_... python executor.py

It long-polls for work, starts each task, "renders" it, and reports success; an image
whose number ends in 7 fails its first attempt (the definition allows one retry).
Ctrl-C (SIGINT) or SIGTERM stops it between two calls, exit status 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

BASE = os.environ.get("TASKS_API_URL", "http://127.0.0.1:8000/tasks").rstrip("/")
TOKEN = os.environ.get("TASKS_API_TOKEN", "")
DEFINITION = "demo/thumbnail"


def call(path: str, body: object) -> Any:
    request = urllib.request.Request(
        f"{BASE}/{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def render(params: dict[str, Any], attempt: int) -> dict[str, Any]:
    """Pretend to render a thumbnail."""
    time.sleep(0.2)
    if params["image"].removesuffix(".jpg").endswith("7") and attempt == 1:
        raise OSError(f"cannot decode {params['image']}")
    return {"thumbnail": f"{params['image']}@{params['width']}px"}


def run_one(task: dict[str, Any]) -> None:
    ids = {"exec_id": task["exec_id"]}
    call(f"{task['id']}/start", ids)
    try:
        result = render(task["params"], task["attempts"] + 1)
    except OSError as exc:
        call(f"{task['id']}/fail", {**ids, "error": {"code": "decode_error", "message": str(exc)}})
        print(f"executor: task {task['id']} failed: {exc}", flush=True)
    else:
        call(f"{task['id']}/success", {**ids, "result": result})
        print(f"executor: task {task['id']} done: {result['thumbnail']}", flush=True)


def main() -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
    if not TOKEN:
        print(
            "executor: set TASKS_API_TOKEN (manage.py tasks_coord_createapitoken USER)",
            file=sys.stderr,
        )
        return 2
    print(f"executor: long-polling {BASE} for {DEFINITION!r} tasks", flush=True)
    pause = 0.5
    try:
        while True:
            try:
                answer = call("long-poll", {"definitions": [DEFINITION], "timeout": 20})
                for task in answer["tasks"]:
                    try:
                        run_one(task)
                    except urllib.error.HTTPError as error:
                        if error.code != 409:  # 409: the task was handed out again; drop it
                            raise
                pause = 0.5
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                # The server is not up yet, or restarting: try again a little later.
                print(f"executor: {error}; retrying in {pause:.1f}s", flush=True)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
    except KeyboardInterrupt:
        print("executor: stopped", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
