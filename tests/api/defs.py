"""The task definitions the API tests use (imported by their conftest and by the test server)."""

from django_tasks_coord import definitions

INVOICE_PARAMS = {
    "type": "object",
    "properties": {
        "invoiceId": {"type": "integer"},
        "customer": {
            "type": "object",
            "properties": {"email": {"type": "string", "maxLength": 50}},
            "required": ["email"],
        },
        "resourceType": {"type": "string"},
    },
    "required": ["invoiceId"],
}

BASIC = definitions.define("test/basic", description="No schemas, default timeouts.")
INVOICE = definitions.define(
    "billing/send-invoice",
    params_schema=INVOICE_PARAMS,
    result_schema={
        "type": "object",
        "properties": {"sent": {"type": "boolean"}},
        "required": ["sent"],
    },
    error_schema={
        "type": "object",
        "properties": {"code": {"type": "string"}},
        "required": ["code"],
    },
    requested_to_start_timeout=5,
    in_progress_timeout=30,
    allowed_retry_count=1,
    retry_delay=10,
)
LIMITED = definitions.define("test/limited", concurrency_limit=3)
PER_KEY = definitions.define(
    "test/per-key", concurrency_limit=2, concurrency_key_path=["params", "resourceType"]
)
#: For the end-to-end tests: short timeouts, so that a real node's reaper acts within a second.
E2E = definitions.define(
    "e2e/sum",
    params_schema={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    result_schema={
        "type": "object",
        "properties": {"sum": {"type": "integer"}},
        "required": ["sum"],
    },
    requested_to_start_timeout=1,
    in_progress_timeout=5,
    allowed_retry_count=1,
    retry_delay=0.2,
)
