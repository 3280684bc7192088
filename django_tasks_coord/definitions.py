"""Task definitions: task types that executors in any language run over the HTTP API.

::

    # myapp/tasks.py
    from django_tasks_coord import definitions

    definitions.define(
        "billing/send-invoice",
        params_schema={
            "type": "object",
            "properties": {"invoiceId": {"type": "integer"}, "resourceType": {"type": "string"}},
            "required": ["invoiceId"],
        },
        in_progress_timeout=60,
        concurrency_limit=2,
        concurrency_key_path=["params", "resourceType"],
    )

Definitions are declared in code, in an app's ``tasks.py`` or ``jobs.py``, which
:func:`autodiscover` imports (``runscheduler`` and the API do, at start-up and on their
first request). :func:`sync` mirrors them into the ``TaskDefinition`` table (read by
the admin and by processes running other code) and registers each one's topic: a
definition's tasks are ordinary ``Task`` rows of the topic named after it, so the
queue API, the admin and the reaper see one truth. The lifecycle of those tasks is in
:mod:`django_tasks_coord.executions`.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import jsonschema
from django.utils.module_loading import autodiscover_modules

from django_tasks_coord import db
from django_tasks_coord.exceptions import (
    DefinitionError,
    InvalidArgumentError,
    SchemaViolationError,
    UnknownDefinitionError,
)
from django_tasks_coord.models import TaskDefinition
from django_tasks_coord.retry import non_negative_seconds
from django_tasks_coord.topics import register_topic, validate_topic_name
from django_tasks_coord.validation import json_pointer

logger = logging.getLogger(__name__)

#: The JSON Schema dialect of definitions' schemas (unless a schema names its own ``$schema``).
Validator = jsonschema.Draft202012Validator
#: Concurrency keys longer than this are stored as a digest (the column's width).
_KEY_WIDTH = 255


def _seconds(value: object, name: str, setting: str) -> float:
    try:
        return non_negative_seconds(value, setting)  # type: ignore[arg-type]
    except InvalidArgumentError as exc:
        raise DefinitionError(f"Definition {name!r}: {exc}") from None


def _validator(schema: object, name: str, setting: str) -> Any:
    if schema is None:
        return None
    if not isinstance(schema, Mapping | bool):
        raise DefinitionError(
            f"Definition {name!r}: {setting} must be a JSON Schema (a dict), not {schema!r}."
        )
    cls = jsonschema.validators.validator_for(schema, default=Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise DefinitionError(
            f"Definition {name!r}: {setting} is not a valid JSON Schema: {exc.message} "
            f"(at {json_pointer(exc.path)})."
        ) from exc
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@dataclass(frozen=True)
class Definition:
    """A task type for executors: its timeouts, retries, concurrency limit and JSON Schemas.

    Seconds may be given as numbers or timedeltas. ``concurrency_limit`` caps the tasks
    requested or in progress at once (None: no cap); with ``concurrency_key_path``
    (e.g. ``["params", "resourceType"]``) the cap applies per value found there, tasks
    without a value sharing one cap. ``allowed_retry_count`` failed attempts are
    retried, each after ``retry_delay``; the next failure is final.
    """

    name: str
    requested_to_start_timeout: float = 10.0
    in_progress_timeout: float = 120.0
    allowed_retry_count: int = 2
    retry_delay: float = 10.0
    concurrency_limit: int | None = None
    concurrency_key_path: tuple[str | int, ...] | None = None
    params_schema: Mapping[str, Any] | None = None
    result_schema: Mapping[str, Any] | None = None
    error_schema: Mapping[str, Any] | None = None
    description: str = ""
    _validators: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = validate_topic_name(self.name)
        for setting in ("requested_to_start_timeout", "in_progress_timeout", "retry_delay"):
            object.__setattr__(self, setting, _seconds(getattr(self, setting), name, setting))
        count = self.allowed_retry_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DefinitionError(
                f"Definition {name!r}: allowed_retry_count must be an int >= 0, not {count!r}."
            )
        limit = self.concurrency_limit
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise DefinitionError(
                f"Definition {name!r}: concurrency_limit must be None or an int >= 1, not {limit!r}."
            )
        path = self.concurrency_key_path
        if path is not None:
            if (
                isinstance(path, str)
                or not isinstance(path, Sequence)
                or len(path) < 2
                or path[0] != "params"
                or not builtins.all(
                    isinstance(p, str | int) and not isinstance(p, bool) for p in path
                )
            ):
                raise DefinitionError(
                    f"Definition {name!r}: concurrency_key_path must be a list of keys and "
                    f'indexes starting with "params", e.g. ["params", "resourceType"], not {path!r}.'
                )
            if limit is None:
                raise DefinitionError(
                    f"Definition {name!r}: concurrency_key_path needs a concurrency_limit."
                )
            object.__setattr__(self, "concurrency_key_path", tuple(path))
        if not isinstance(self.description, str):
            raise DefinitionError(f"Definition {name!r}: description must be a str.")
        validators = {
            document: _validator(getattr(self, f"{document}_schema"), name, f"{document}_schema")
            for document in ("params", "result", "error")
        }
        object.__setattr__(self, "_validators", validators)

    # --- validation -------------------------------------------------------------------

    def validate(self, document: str, value: Any) -> None:
        """Check ``value`` against the ``document`` schema (``params``, ``result``, ``error``).

        Raises :class:`SchemaViolationError` naming the failing value's JSON Pointer.
        A definition without that schema accepts anything JSON.
        """
        validator = self._validators[document]
        if validator is None:
            return
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is None:
            return
        pointer = json_pointer(error.absolute_path)
        raise SchemaViolationError(
            f"/{document}{pointer} does not match the {document} schema of {self.name!r}: "
            f"{error.message}",
            document=document,
            path=pointer,
        )

    def concurrency_key(self, params: Any) -> str:
        """The key under which a task with ``params`` counts against the concurrency limit.

        ``""`` without a key path, or when the path finds nothing. A string value is the
        key itself; other values are keyed by their canonical JSON; keys longer than
        the column are replaced by their SHA-256 digest.
        """
        if self.concurrency_key_path is None:
            return ""
        value: Any = {"params": params}
        for part in self.concurrency_key_path:
            if isinstance(value, dict) and isinstance(part, str):
                if part not in value:
                    return ""
                value = value[part]
            elif isinstance(value, list) and isinstance(part, int):
                if not -len(value) <= part < len(value):
                    return ""
                value = value[part]
            else:
                return ""
        key = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        if len(key) > _KEY_WIDTH:
            key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
        return key

    # --- storage ----------------------------------------------------------------------

    def row_fields(self) -> dict[str, Any]:
        """The ``TaskDefinition`` columns for this definition."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        values.pop("name")
        path = values["concurrency_key_path"]
        values["concurrency_key_path"] = list(path) if path is not None else None
        for document in ("params", "result", "error"):
            schema = values[f"{document}_schema"]
            values[f"{document}_schema"] = json.loads(json.dumps(schema)) if schema else schema
        return values

    @classmethod
    def from_row(cls, row: TaskDefinition) -> Definition:
        """The definition a ``TaskDefinition`` row stores."""
        return cls(
            name=row.name,
            requested_to_start_timeout=row.requested_to_start_timeout,
            in_progress_timeout=row.in_progress_timeout,
            allowed_retry_count=row.allowed_retry_count,
            retry_delay=row.retry_delay,
            concurrency_limit=row.concurrency_limit,
            concurrency_key_path=row.concurrency_key_path,
            params_schema=row.params_schema,
            result_schema=row.result_schema,
            error_schema=row.error_schema,
            description=row.description,
        )


# --- the registry ---------------------------------------------------------------------

_definitions: dict[str, Definition] = {}
_lock = threading.Lock()
_discovered = False


def register(definition: Definition) -> Definition:
    """Add ``definition`` to the registry; declaring the same name again must not change it."""
    if not isinstance(definition, Definition):
        raise DefinitionError(f"Expected a Definition, not {definition!r}.")
    with _lock:
        known = _definitions.get(definition.name)
        if known is not None and known != definition:
            raise DefinitionError(
                f"Definition {definition.name!r} is declared twice with different settings: "
                f"{known!r} and {definition!r}."
            )
        _definitions[definition.name] = definition
    return definition


def define(name: str, **settings: Any) -> Definition:
    """Declare a task definition (see :class:`Definition` for the settings) and return it."""
    try:
        definition = Definition(name, **settings)
    except TypeError as exc:  # an unknown setting
        raise DefinitionError(f"Definition {name!r}: {exc}.") from exc
    return register(definition)


def forget(name: str) -> None:
    """Drop a declaration from the registry (tests). Its row and tasks stay."""
    with _lock:
        _definitions.pop(name, None)


def all() -> list[Definition]:
    """Every declared definition, by name."""
    with _lock:
        return [_definitions[name] for name in sorted(_definitions)]


def declared(name: str) -> Definition | None:
    """The definition declared in this process under ``name``, if any."""
    with _lock:
        return _definitions.get(name)


def get(name: str) -> Definition:
    """The definition named ``name``: declared in this process, else as stored by :func:`sync`.

    Raises :class:`UnknownDefinitionError`.
    """
    if not isinstance(name, str) or "\x00" in name or len(name) > 100:
        raise UnknownDefinitionError(f"No task definition is named {name!r}.")
    definition = declared(name)
    if definition is not None:
        return definition
    row = TaskDefinition.objects.using(db.alias()).filter(name=name).first()
    if row is not None:
        return Definition.from_row(row)
    known = sorted(names())[:50]
    raise UnknownDefinitionError(
        f"No task definition is named {name!r}. Known definitions: "
        f"{', '.join(map(repr, known)) or 'none'}."
    )


def names() -> set[str]:
    """Names of every definition, declared here or stored (the topics that hold their tasks)."""
    with _lock:
        found = set(_definitions)
    stored = TaskDefinition.objects.using(db.alias()).values_list("name", flat=True)
    return found | set(stored)


def autodiscover() -> None:
    """Import every installed app's ``tasks`` and ``jobs`` modules (once per process)."""
    global _discovered
    if _discovered:
        return
    autodiscover_modules("tasks", "jobs")
    _discovered = True


_prepared = False


def prepare() -> None:
    """:func:`autodiscover` and :func:`sync`, once per process (the API's first request does it).

    A failure (the table not migrated yet) is raised and tried again next time.
    """
    global _prepared
    if _prepared:
        return
    with _prepare_lock:
        if not _prepared:
            autodiscover()
            sync()
            _prepared = True


_prepare_lock = threading.Lock()


def sync() -> dict[str, list[str]]:
    """Mirror the declarations into ``TaskDefinition`` rows and register their topics.

    New definitions are created, changed ones updated, unchanged ones left alone; rows
    no code declares any more get ``declared`` False (they and their tasks are kept).
    Returns the names per change.
    """
    changes: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "gone": []}
    using = db.alias()
    rows = {row.name: row for row in TaskDefinition.objects.using(using)}
    for definition in all():
        register_topic(definition.name)
        wanted = {**definition.row_fields(), "declared": True}
        row = rows.get(definition.name)
        if row is not None and all_equal(row, wanted):
            changes["unchanged"].append(definition.name)
            continue
        TaskDefinition.objects.using(using).update_or_create(name=definition.name, defaults=wanted)
        changes["created" if row is None else "updated"].append(definition.name)
    gone = [name for name, row in rows.items() if row.declared and declared(name) is None]
    if gone:
        TaskDefinition.objects.using(using).filter(name__in=gone).update(declared=False)
        changes["gone"] = gone
    for change, changed in changes.items():
        if changed and change != "unchanged":
            logger.info("Task definitions %s: %s.", change, ", ".join(sorted(changed)))
    return changes


def all_equal(row: TaskDefinition, values: dict[str, Any]) -> bool:
    """Whether ``row`` already holds ``values``."""
    return builtins.all(getattr(row, column) == value for column, value in values.items())
