"""A task definition with an invalid JSON Schema (system check tasks_coord.E005)."""

from django_tasks_coord import definitions

definitions.define("checks/bad-schema", params_schema={"type": "no-such-type"})
