"""The JSON Schemas of the HTTP API's request and response bodies.

:data:`SCHEMAS` is published as the OpenAPI document's ``components/schemas``
(:func:`django_tasks_coord.api.openapi.document`), and the views validate request
bodies with exactly these schemas. Literal data: the limits below are the only names
it is written with.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DATETIME",
    "MAX_BATCH",
    "MAX_PAGE",
    "MAX_POLL",
    "MAX_TASK_ID",
    "MAX_TIMEOUT",
    "NAME",
    "SCHEMAS",
    "UUID",
]

#: The most tasks one poll or claim hands out, the most reports one batch completion holds,
#: and the largest page of a list.
MAX_POLL = 100
MAX_BATCH = 100
#: The most checkpoints one notify stores: ``running.CHECKPOINTS_PER_NOTIFY`` (this module
#: imports no models, so that the OpenAPI document builds without settings).
CHECKPOINTS_PER_NOTIFY = 100
MAX_PAGE = 500
#: Task ids are 64-bit signed integers.
MAX_TASK_ID = 2**63 - 1
#: The longest wait a long-poll may ask for (the server also caps it at LONG_POLL_MAX_TIMEOUT).
MAX_TIMEOUT = 3600

UUID = {"type": "string", "format": "uuid"}
TASK_ID = {"type": "integer", "minimum": 0, "maximum": MAX_TASK_ID}
DATETIME = {"type": ["string", "null"], "format": "date-time"}
NAME = {"type": "string", "minLength": 1, "maxLength": 100}
DEFINITIONS = {"type": "array", "items": NAME, "minItems": 1, "maxItems": 100}

SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "Machine-readable reason."},
                    "message": {"type": "string", "description": "What happened, for people."},
                    "path": {
                        "type": "string",
                        "description": "JSON Pointer of the offending value, when one is at fault.",
                    },
                },
                "required": ["code", "message"],
            }
        },
        "required": ["error"],
    },
    "Task": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "definition": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["waiting", "ready", "requested", "in_progress", "done"],
            },
            "outcome": {
                "type": ["string", "null"],
                "enum": ["succeeded", "failed", "canceled", None],
            },
            "outcome_reason": {
                "type": ["string", "null"],
                "description": "Why the task ended as it did, or why its last attempt or "
                "hand-out ended while it waits again: failed_by_executor, unknown_error, "
                "in_progress_timeout, requested_to_start_timeout, canceled.",
            },
            "params": {},
            "result": {},
            "error": {
                "description": "The last failed attempt's error while the task waits for its "
                "retry or runs it again; the task's once it failed; null once it succeeded."
            },
            "label": {"type": "string"},
            "requester": {"type": "string"},
            "priority": {"type": "integer"},
            "attempts": {"type": "integer", "description": "Attempts started."},
            "retry_count": {"type": "integer", "description": "Failed attempts retried."},
            "exec_id": {
                "type": ["string", "null"],
                "format": "uuid",
                "description": "The current execution's id: quote it in every executor call.",
            },
            "execute_at": DATETIME,
            "deadline": {
                **DATETIME,
                "description": "When a requested or in-progress task times out.",
            },
            "created_at": {"type": "string", "format": "date-time"},
            "started_at": DATETIME,
            "finished_at": DATETIME,
            "traceparent": {
                "type": ["string", "null"],
                "description": "The W3C trace context of the span that created the task (null "
                "without tracing): start your spans under it, and send a `traceparent` header "
                "with start, notify and outcome calls so that they join the trace.",
            },
            "cancel_requested": {
                "type": "boolean",
                "description": "A user canceled the task while it was in progress: its "
                "executor should stop and report (success or fail). It ends canceled whatever "
                "it reports, or at its in-progress timeout. The answer to notify carries it.",
            },
            "progress": {
                "description": "The progress its executor last reported with notify (any "
                "small JSON value), or null.",
            },
            "checkpoints": {
                "type": "object",
                "description": "In the task read and the answer to notify only: what its "
                "executors stored with notify (`checkpoints`), in this attempt and earlier "
                "ones, name to value. An executor starting a retried task skips the steps "
                "found here.",
            },
        },
        "required": [
            "id",
            "definition",
            "status",
            "outcome",
            "outcome_reason",
            "params",
            "result",
            "error",
            "label",
            "requester",
            "priority",
            "attempts",
            "retry_count",
            "exec_id",
            "execute_at",
            "deadline",
            "created_at",
            "started_at",
            "finished_at",
            "cancel_requested",
            "progress",
        ],
    },
    "Tasks": {
        "type": "object",
        "properties": {"tasks": {"type": "array", "items": {"$ref": "#/components/schemas/Task"}}},
        "required": ["tasks"],
    },
    "TaskPage": {
        "type": "object",
        "properties": {
            "tasks": {"type": "array", "items": {"$ref": "#/components/schemas/Task"}},
            "next_before": {
                "type": ["integer", "null"],
                "description": "Pass as `before` for the next page; null on the last page.",
            },
        },
        "required": ["tasks", "next_before"],
    },
    "Definition": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "description": {"type": "string"},
            "requested_to_start_timeout": {"type": "number"},
            "in_progress_timeout": {"type": "number"},
            "allowed_retry_count": {"type": "integer"},
            "retry_delay": {"type": "number"},
            "concurrency_limit": {"type": ["integer", "null"]},
            "concurrency_key_path": {
                "type": ["array", "null"],
                "items": {"type": ["string", "integer"]},
            },
            "params_schema": {},
            "result_schema": {},
            "error_schema": {},
        },
        "required": [
            "name",
            "description",
            "requested_to_start_timeout",
            "in_progress_timeout",
            "allowed_retry_count",
            "retry_delay",
            "concurrency_limit",
            "concurrency_key_path",
            "params_schema",
            "result_schema",
            "error_schema",
        ],
    },
    "Definitions": {
        "type": "object",
        "properties": {
            "definitions": {"type": "array", "items": {"$ref": "#/components/schemas/Definition"}}
        },
        "required": ["definitions"],
    },
    "PollRequest": {
        "type": "object",
        "properties": {
            "definitions": DEFINITIONS,
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_POLL, "default": 1},
        },
        "required": ["definitions"],
        "additionalProperties": False,
    },
    "LongPollRequest": {
        "type": "object",
        "properties": {
            "definitions": DEFINITIONS,
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_POLL, "default": 1},
            "timeout": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_TIMEOUT,
                "default": 30,
                "description": "Seconds to wait for work (capped by the server's "
                "LONG_POLL_MAX_TIMEOUT setting).",
            },
        },
        "required": ["definitions"],
        "additionalProperties": False,
    },
    "ClaimRequest": {
        "type": "object",
        "properties": {
            "definitions": DEFINITIONS,
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_POLL, "default": 1},
            "timeout": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_TIMEOUT,
                "default": 0,
                "description": "Seconds to wait for work, as a long-poll (capped by the "
                "server's LONG_POLL_MAX_TIMEOUT setting); 0: answer at once.",
            },
        },
        "required": ["definitions"],
        "additionalProperties": False,
    },
    "Report": {
        "type": "object",
        "description": "The outcome of one execution: a success with its result, or a failure "
        "with its error (retried while retries remain, unless `retry` is false).",
        "properties": {
            "id": TASK_ID,
            "exec_id": UUID,
            "outcome": {"enum": ["succeeded", "failed"]},
            "result": {"description": "A success's result, checked by the result schema."},
            "error": {
                "description": "A failure's error, checked by the error schema; omitted: "
                "unknown_error."
            },
            "retry": {
                "type": "boolean",
                "default": True,
                "description": "A failure's: false fails for good even if retries remain.",
            },
        },
        "required": ["id", "exec_id", "outcome"],
        "additionalProperties": False,
        # A success has no error and no retry; a failure has no result.
        "if": {"properties": {"outcome": {"const": "succeeded"}}},
        "then": {"propertyNames": {"enum": ["id", "exec_id", "outcome", "result"]}},
        "else": {"propertyNames": {"enum": ["id", "exec_id", "outcome", "error", "retry"]}},
    },
    "CompleteRequest": {
        "type": "object",
        "properties": {
            "tasks": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_BATCH,
                "items": {"$ref": "#/components/schemas/Report"},
            }
        },
        "required": ["tasks"],
        "additionalProperties": False,
    },
    "Completions": {
        "type": "object",
        "properties": {
            "results": {
                "type": "array",
                "description": "One per report, in the order of the request.",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "ok": {
                            "type": "boolean",
                            "description": "Whether the report was accepted; if not, "
                            "nothing changed for that task.",
                        },
                        "status": {
                            "type": "string",
                            "enum": ["waiting", "done"],
                            "description": "Accepted: the task's status now (waiting: "
                            "for its retry).",
                        },
                        "outcome": {
                            "type": ["string", "null"],
                            "enum": ["succeeded", "failed", None],
                            "description": "Accepted: the task's outcome, null while it "
                            "waits for its retry.",
                        },
                        "error": {
                            "description": "Refused: why, as the single call would answer "
                            "(code not_found, stale_exec_id, wrong_state, task_done, "
                            "schema_violation or invalid_request).",
                            "$ref": "#/components/schemas/Error/properties/error",
                        },
                    },
                    "required": ["id", "ok"],
                },
            }
        },
        "required": ["results"],
    },
    "ExecRequest": {
        "type": "object",
        "properties": {"exec_id": UUID},
        "required": ["exec_id"],
        "additionalProperties": False,
    },
    "NotifyRequest": {
        "type": "object",
        "properties": {
            "exec_id": UUID,
            "progress": {
                "description": "How far the execution got (any JSON value of at most "
                "PROGRESS_MAX_BYTES bytes, 4096 by default), stored as the task's `progress`.",
            },
            "checkpoints": {
                "type": "object",
                "maxProperties": CHECKPOINTS_PER_NOTIFY,
                "description": "Steps done, to resume from if the task is run again (a retry, "
                f"a new executor after a timeout): at most {CHECKPOINTS_PER_NOTIFY} per call, "
                "names (at most 200 characters, not starting "
                "with `tasks_coord.`) to JSON values, stored durably under this exec_id and "
                "returned by the task read and this call's answer. A name sent again is "
                "replaced.",
            },
        },
        "required": ["exec_id"],
        "additionalProperties": False,
    },
    "SuccessRequest": {
        "type": "object",
        "properties": {
            "exec_id": UUID,
            "result": {"description": "Checked by the result schema."},
        },
        "required": ["exec_id"],
        "additionalProperties": False,
    },
    "FailRequest": {
        "type": "object",
        "properties": {
            "exec_id": UUID,
            "error": {"description": "Checked by the error schema; omitted: unknown_error."},
            "retry": {
                "type": "boolean",
                "default": True,
                "description": "False: fail for good even if retries remain.",
            },
        },
        "required": ["exec_id"],
        "additionalProperties": False,
    },
    "CreateRequest": {
        "type": "object",
        "properties": {
            "definition": NAME,
            "params": {"description": "Checked by the params schema."},
            "execute_at": {
                "type": "string",
                "format": "date-time",
                "description": "Not ready before (ISO 8601 with a time zone).",
            },
            "label": {"type": "string", "maxLength": 255},
            "priority": {"type": "integer", "minimum": -32768, "maximum": 32767, "default": 0},
        },
        "required": ["definition"],
        "additionalProperties": False,
    },
}
