"""An executor written without Django: plain urllib against the HTTP API, as any language would.

Usage: python tests/api/executor_client.py BASE_URL TOKEN DEFINITION COUNT

Long-polls DEFINITION, starts each task, sends a heartbeat, computes ``a + b`` and reports it.
Params may ask it to misbehave once: ``"fail_first": true`` fails the first attempt,
``"abandon_first": true`` polls the task and never starts it (its requested-to-start timeout
must hand it out again). Stops after COUNT successes, or after 5 empty long-polls in a row;
prints a JSON summary on stdout.
"""

import json
import sys
import urllib.error
import urllib.request


def call(base: str, token: str, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{base}/{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def main() -> None:
    base, token, definition, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    summary = {"succeeded": [], "failed_once": [], "abandoned": [], "conflicts": 0}
    empty = 0
    while len(summary["succeeded"]) < count and empty < 5:
        status, body = call(
            base, token, "POST", "long-poll", {"definitions": [definition], "timeout": 2}
        )
        assert status == 200, body
        if not body["tasks"]:
            empty += 1
            continue
        empty = 0
        for task in body["tasks"]:
            params, exec_id = task["params"], {"exec_id": task["exec_id"]}
            if params.get("abandon_first") and task["id"] not in summary["abandoned"]:
                summary["abandoned"].append(task["id"])
                continue
            status, started = call(base, token, "POST", f"{task['id']}/start", exec_id)
            if status == 409:
                summary["conflicts"] += 1
                continue
            call(base, token, "POST", f"{task['id']}/notify", exec_id)
            if params.get("fail_first") and started["attempts"] == 1:
                call(
                    base,
                    token,
                    "POST",
                    f"{task['id']}/fail",
                    {**exec_id, "error": {"why": "first"}},
                )
                summary["failed_once"].append(task["id"])
                continue
            result = {"sum": params["a"] + params["b"]}
            status, done = call(
                base, token, "POST", f"{task['id']}/success", {**exec_id, "result": result}
            )
            assert status == 200, done
            summary["succeeded"].append(task["id"])
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
