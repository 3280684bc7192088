"""Property-based tests: schemathesis drives every operation from the OpenAPI document (valid and
invalid inputs), and raw fuzzed bodies hit every endpoint. No 5xx, no response outside the
document."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance

from django_tasks_coord import executions
from django_tasks_coord.api import openapi
from django_tasks_coord.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

schema = schemathesis.openapi.from_dict(openapi.document("/tasks"))
schema.app = WSGIHandler()  # requests go straight to Django, in process


TOKEN: list[str] = []
# Long-polls end at once; in process, every request has its own event loop: no LISTEN.
FAST_LONG_POLLS = {
    "LONG_POLL_MAX_TIMEOUT": 0.05,
    "LONG_POLL_INTERVAL": 0.01,
    "LISTEN_NOTIFY": False,
}


@schema.auth(refresh_interval=None)
class BearerToken:
    """The fixture's token, as explicit auth: schemathesis still probes without it and with a
    made-up one, and expects a 401 then."""

    def get(self, case, context) -> str:
        return TOKEN[0] if TOKEN else "dtc_none"  # asked once at collection too

    def set(self, case, data, context) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def token(transactional_db) -> str:
    """A superuser's token (every permission), and a few tasks in every state to hit."""
    from django.contrib.auth.models import User

    from django_tasks_coord.api.auth import issue_token

    _, value = issue_token(User.objects.create_superuser("fuzz"))
    _some_tasks()
    return value


def _some_tasks() -> None:
    """Three tasks of each of two definitions: one in progress, two ready."""
    for definition in ("test/basic", "test/limited"):
        for _ in range(3):
            executions.create(definition)
        (task,) = executions.poll([definition], 1)
        executions.start(task.pk, task.exec_id)


@schema.parametrize()
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@override_settings(
    TASKS_COORD=FAST_LONG_POLLS,
    ALLOWED_HOSTS=["localhost"],
)
def test_every_operation_conforms_to_the_document(case, token):
    TOKEN[:] = [token]
    # Not every schema-valid request can succeed: params, results and errors are checked by
    # each definition's own schema (422), and PostgreSQL cannot store NUL characters (400).
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


BODIES = st.one_of(
    st.binary(max_size=200),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
        ),
        max_leaves=10,
    ).map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries(
        {},
        optional={
            "definitions": st.lists(st.sampled_from(["test/basic", "billing/send-invoice", "x"])),
            "definition": st.sampled_from(["test/basic", "billing/send-invoice", "nope"]),
            "exec_id": st.uuids().map(str) | st.text(max_size=5),
            "limit": st.integers(-5, 200),
            "timeout": st.floats(-1, 0.05) | st.integers(0, 1),
            "params": st.none()
            | st.dictionaries(
                st.sampled_from(["invoiceId", "customer"]), st.integers() | st.text()
            ),
            "result": st.none()
            | st.integers()
            | st.dictionaries(st.text(max_size=5), st.booleans()),
            "error": st.none() | st.text(max_size=5),
            "retry": st.booleans() | st.integers(),
            "execute_at": st.datetimes().map(str) | st.text(max_size=10),
            "label": st.text(max_size=5),
            "priority": st.integers(-40000, 40000),
            "tasks": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "id": st.integers(-2, 2**64) | st.sampled_from([0, 1, 2, 3]),
                        "exec_id": st.uuids().map(str) | st.text(max_size=5),
                        "outcome": st.sampled_from(["succeeded", "failed", "done"]),
                        "result": st.none() | st.integers() | st.text(max_size=5),
                        "error": st.none() | st.dictionaries(st.text(max_size=5), st.booleans()),
                        "retry": st.booleans() | st.integers(),
                    },
                ),
                max_size=4,
            ),
        },
    ).map(lambda value: json.dumps(value).encode()),
)
PATHS = [
    "poll",
    "long-poll",
    "claim",
    "complete",
    "",
    "{id}",
    "{id}/start",
    "{id}/notify",
    "{id}/success",
    "{id}/fail",
    "{id}/cancel",
    "definitions",
    "999999/start",
]


@given(body=BODIES, path=st.sampled_from(PATHS), method=st.sampled_from(["POST", "GET", "PUT"]))
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@override_settings(TASKS_COORD=FAST_LONG_POLLS)
def test_fuzzed_bodies_never_produce_a_500(token, body, path, method):
    task_id = Task.objects.order_by("-pk").values_list("pk", flat=True).first()
    url = "/tasks/" + path.replace("{id}", str(task_id))
    response = Client(raise_request_exception=False).generic(
        method,
        url,
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code < 500, response.content
    assert response["Content-Type"] == "application/json"
    assert "error" in json.loads(response.content) or response.status_code < 300


# --- stateful: the executor calls with the exec_ids the API handed out ---------------------------


EXECUTOR_CALLS = ("start", "notify", "success", "fail")


def _stateful_document() -> dict:
    """The published document's executor operations, with the definition names of requests
    narrowed to the declared ones: random names only reach 404s, and the links need tasks
    that exist."""
    document = copy.deepcopy(openapi.document("/tasks"))
    # The executor's operations only: a user's cancel would end most chains with a 409.
    executor_paths = [
        "/poll",
        "/long-poll",
        "/claim",
        "/complete",
        *(f"/{{task_id}}/{call}" for call in EXECUTOR_CALLS),
    ]
    document["paths"] = {path: document["paths"][path] for path in executor_paths}
    names = {"type": "string", "enum": ["test/basic", "test/limited"]}
    schemas = document["components"]["schemas"]
    for request in ("PollRequest", "LongPollRequest", "ClaimRequest"):
        schemas[request]["properties"]["definitions"]["items"] = names
    schemas["CreateRequest"]["properties"]["definition"] = names
    return document


stateful_schema = schemathesis.openapi.from_dict(_stateful_document())
stateful_schema.app = WSGIHandler()
stateful_schema.auth(refresh_interval=None)(BearerToken)
#: (method, path template, status) of every call the state machine made; "accepted" counts
#: the batch completions that accepted a report.
SEEN: Counter[tuple[str, str, int]] = Counter()
ACCEPTED: Counter[str] = Counter()


class ExecutorWorkflow(stateful_schema.as_state_machine()):  # type: ignore[misc]
    """Follows the document's links: poll/long-poll -> start -> notify/success/fail, with the
    task ids and exec_ids the previous response carried."""

    def setup(self) -> None:
        """Every scenario starts from the same tasks, so that its links resolve alike."""
        Task.objects.all().delete()
        _some_tasks()

    def after_call(self, response, case) -> None:
        SEEN[(case.method.upper(), case.path, response.status_code)] += 1
        if (
            case.path == "/complete"
            and response.status_code == 200
            and any(result["ok"] for result in response.json()["results"])
        ):
            ACCEPTED["reports"] += 1

    def validate_response(self, response, case, **kwargs) -> None:
        assert response.status_code < 500, response.text
        headers = {name.lower(): values for name, values in response.headers.items()}
        assert headers["content-type"] == ["application/json"], response.text
        case.validate_response(response, excluded_checks=[positive_data_acceptance])


def test_executor_calls_with_valid_exec_ids_conform_to_the_document(token):
    """Every step conforms; and the run must reach start, notify, success and fail with the
    exec_ids the API handed out (a 200 each), and a batch completion that accepts a report of
    a claimed task. Schemathesis follows a link's values with a (truly random) probability,
    so the run goes on in rounds until it has, at most 24 (a notify with a valid exec_id
    takes a start or a claim followed by the link to notify: 8 rounds once fell short)."""
    TOKEN[:] = [token]
    SEEN.clear()
    ACCEPTED.clear()
    wanted = {("POST", f"/{{task_id}}/{call}") for call in EXECUTOR_CALLS}
    wanted.add(("POST", "/complete"))

    def reached() -> set[tuple[str, str]]:
        done = {(method, path) for (method, path, status) in SEEN if status == 200}
        done.discard(("POST", "/complete"))  # a 200 may refuse every report: see ACCEPTED
        if ACCEPTED["reports"]:
            done.add(("POST", "/complete"))
        return done & wanted

    with override_settings(TASKS_COORD=FAST_LONG_POLLS, ALLOWED_HOSTS=["localhost"]):
        for _ in range(24):
            ExecutorWorkflow.run(
                settings=settings(
                    max_examples=25,
                    stateful_step_count=10,
                    deadline=None,
                    # Hypothesis derandomizes under CI=true: every round would repeat the
                    # first, and a round that misses a call would miss it 24 times
                    derandomize=False,
                    suppress_health_check=list(HealthCheck),
                    database=None,
                )
            )
            if reached() == wanted:
                break
    print(f"\nstateful run: {sorted(SEEN.items())}, completions accepting a report: {ACCEPTED}")
    assert reached() == wanted, str(sorted(SEEN.items()))
