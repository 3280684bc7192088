"""Every bad workflow is refused before anything is written, with a WorkflowDefinitionError
(a TasksCoordError) that names the step and what is wrong."""

from __future__ import annotations

import pytest

from django_tasks_coord import workflows
from django_tasks_coord.exceptions import InvalidArgumentError, TasksCoordError
from django_tasks_coord.models import Task, Workflow, WorkflowStep
from django_tasks_coord.workflows import WorkflowDefinitionError
from tests.api import defs  # noqa: F401  (declares the test definitions)
from tests.workflows import tasks

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _work(db):
    workflows.push  # noqa: B018  (the module is importable without a database)
    from django_tasks_coord import queue

    queue.register_topic("work")


def refused(steps, match: str, **kwargs) -> WorkflowDefinitionError:
    with pytest.raises(WorkflowDefinitionError, match=match) as info:
        workflows.start("bad", steps, **kwargs)
    assert not Workflow.objects.exists()
    assert not WorkflowStep.objects.exists()
    assert not Task.objects.exists()
    return info.value


def a(name: str, **kwargs) -> workflows.Step:
    return workflows.push("work", name, name=name, **kwargs)


def test_the_errors_derive_from_the_base_class():
    assert issubclass(WorkflowDefinitionError, TasksCoordError)
    assert issubclass(WorkflowDefinitionError, InvalidArgumentError)
    assert issubclass(workflows.UnknownWorkflowError, TasksCoordError)


def test_a_cycle_is_refused():
    error = refused([a("x", after="y"), a("y", after="x"), a("z")], "cycle")
    assert "'x'" in str(error) and "'y'" in str(error) and "'z'" not in str(error)


def test_a_step_after_itself_is_refused():
    refused([a("x", after="x")], "after itself")


def test_an_unknown_parent_is_refused():
    refused([a("x", after="nope")], "'nope', which is not a step")


def test_two_steps_of_one_name_are_refused():
    refused([a("x"), a("x")], "Two steps .* named 'x'")


def test_an_empty_workflow_is_refused():
    refused([], "at least one step")


def test_an_unknown_topic_is_refused():
    refused([workflows.push("nowhere", "i")], "nowhere")


def test_an_unknown_definition_is_refused():
    refused([workflows.definition("no/such")], "no/such")


def test_params_the_definition_refuses_are_refused():
    refused([workflows.definition("billing/send-invoice", {"invoiceId": "one"})], "invoiceId")


def test_an_unknown_function_is_refused():
    refused([workflows.task("tests.workflows.tasks.nope")], "cannot import")


def test_a_function_that_is_not_a_task_is_refused():
    refused([workflows.task("os.path.join")], "not a Django @task")


def test_an_unknown_backend_is_refused():
    refused([workflows.task(tasks.step, kwargs={"label": "x"}, backend="nope")], "backend 'nope'")


def test_arguments_that_are_not_json_are_refused():
    refused([workflows.task(tasks.step, kwargs={"label": object()})], "arguments of step")
    refused([workflows.push("work", "i", {"when": {1, 2}})], "arguments of step")


def test_bad_options_are_refused():
    refused([a("x")], "options", options={"x": object()})
    refused([a("x")], "on_failure", on_failure="explode")


def test_bad_step_options_are_refused_when_built():
    with pytest.raises(WorkflowDefinitionError, match="on_failure"):
        a("x", on_failure="explode")
    with pytest.raises(WorkflowDefinitionError, match="after="):
        a("x", after=[3])
    with pytest.raises(WorkflowDefinitionError, match="dict payload"):
        workflows.push("work", "i", [1], results=True)
    with pytest.raises(WorkflowDefinitionError, match="name"):
        a("")


def test_nothing_is_written_when_a_late_step_is_bad():
    refused(workflows.chain(a("x"), a("y"), workflows.push("nowhere", "z")), "nowhere")
