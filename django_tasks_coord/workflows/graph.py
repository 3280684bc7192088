"""Building a workflow: its steps, their ``after`` edges, ``chain`` and ``group``.

A :class:`Step` says what task it becomes (:func:`task`, :func:`push`, :func:`definition`),
after which steps, and what its failure does to its dependants. :func:`chain` and
:func:`group` are shorthands that set ``after``; :func:`flatten` checks the whole graph
(names, parents, cycles, JSON arguments) before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_tasks_coord.exceptions import InvalidArgumentError, WorkflowDefinitionError
from django_tasks_coord.models import OnFailure, StepKind
from django_tasks_coord.validation import check_payload, check_text

__all__ = ["Step", "chain", "definition", "flatten", "group", "push", "task"]

#: The longest step name (``WorkflowStep.name``).
MAX_NAME = 200


@dataclass(eq=False)
class Step:
    """One step of a workflow: what task it becomes and after which steps.

    Build steps with :func:`task`, :func:`push` or :func:`definition`. ``after`` holds the
    parents (steps or step names); :func:`chain` appends to it. Steps compare by identity:
    one object is one step, however many chains it is in.
    """

    kind: StepKind
    target: str  #: the @task function's path, the topic, or the definition's name
    arguments: Any = None  #: {"args", "kwargs"}, the payload, or the params
    name: str | None = None
    after: list[Step | str] = field(default_factory=list)
    on_failure: OnFailure | None = None  #: None: the workflow's default
    results: bool = False  #: pass the parents' results, by step name, as ``results``
    identifier: str = ""  #: a push's identifier
    backend: str = ""  #: a @task's backend alias

    def then(self, *steps: Step) -> list[Step]:
        """``chain(self, group(*steps))``: ``steps`` run after this one."""
        return chain(self, list(steps))


def _common(
    name: str | None,
    after: Step | str | Iterable[Step | str],
    on_failure: OnFailure | str | None,
) -> dict[str, Any]:
    """The options every kind of step takes, checked."""
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME):
        raise WorkflowDefinitionError(
            f"A step's name must be a str of 1 to {MAX_NAME} characters, not {name!r}."
        )
    if name is not None:
        check_text(name, "name")
    parents = [after] if isinstance(after, Step | str) else list(after)
    for parent in parents:
        if not isinstance(parent, Step | str):
            raise WorkflowDefinitionError(
                f"after= takes steps or step names, not {parent!r} (step {name!r})."
            )
    if on_failure is not None:
        try:
            on_failure = OnFailure(on_failure)
        except ValueError:
            choices = ", ".join(repr(choice.value) for choice in OnFailure)
            raise WorkflowDefinitionError(
                f"on_failure={on_failure!r} is not one of {choices} (step {name!r})."
            ) from None
    return {"name": name, "after": parents, "on_failure": on_failure}


def task(
    function: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    after: Step | str | Iterable[Step | str] = (),
    on_failure: OnFailure | str | None = None,
    results: bool = False,
    backend: str = "default",
) -> Step:
    """A step that enqueues a Django ``@task`` (the function, or its dotted path) on
    ``backend`` (one of this app's ``DatabaseBackend``s) with ``args`` and ``kwargs``.

    With ``results``, its parents' results are passed as the keyword argument ``results``
    (a dict keyed by step name). Its retries follow the task's own retry policy.
    """
    path = getattr(function, "module_path", function)
    if not isinstance(path, str) or not path:
        raise WorkflowDefinitionError(
            f"task() takes a @task function or its dotted path, not {function!r}."
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise WorkflowDefinitionError(f"kwargs must be a dict, not {kwargs!r} (task {path}).")
    arguments = {"args": list(args), "kwargs": dict(kwargs or {})}
    return Step(
        StepKind.TASK,
        path,
        arguments,
        results=bool(results),
        backend=backend,
        **_common(name, after, on_failure),
    )


def push(
    topic: str,
    identifier: str,
    payload: Any = None,
    *,
    name: str | None = None,
    after: Step | str | Iterable[Step | str] = (),
    on_failure: OnFailure | str | None = None,
    results: bool = False,
) -> Step:
    """A step that pushes ``(identifier, payload)`` to ``topic``, for its consumer.

    With ``results``, the payload (a dict, or None) gets the key ``"results"``: its
    parents' results by step name. Its retries follow the consumer's retry policy.
    """
    if not isinstance(topic, str) or not isinstance(identifier, str):
        raise WorkflowDefinitionError(
            f"push() takes a topic name and an identifier (str), not {topic!r}, {identifier!r}."
        )
    if results and not isinstance(payload, dict | None):
        raise WorkflowDefinitionError(
            f"A push step with results=True needs a dict payload (or None), not {payload!r}."
        )
    return Step(
        StepKind.PUSH,
        topic,
        payload,
        identifier=identifier,
        results=bool(results),
        **_common(name, after, on_failure),
    )


def definition(
    definition: str,
    params: Any = None,
    *,
    name: str | None = None,
    after: Step | str | Iterable[Step | str] = (),
    on_failure: OnFailure | str | None = None,
    results: bool = False,
) -> Step:
    """A step that creates a task of the executor definition ``definition`` with ``params``
    (run by an external executor through the HTTP API).

    With ``results``, the params (a dict, or None) get the key ``"results"``.
    """
    if not isinstance(definition, str):
        raise WorkflowDefinitionError(f"definition() takes a name, not {definition!r}.")
    if results and not isinstance(params, dict | None):
        raise WorkflowDefinitionError(
            f"A definition step with results=True needs dict params (or None), not {params!r}."
        )
    return Step(
        StepKind.DEFINITION,
        definition,
        params,
        results=bool(results),
        **_common(name, after, on_failure),
    )


def _steps(item: Step | Iterable[Step]) -> list[Step]:
    if isinstance(item, Step):
        return [item]
    if isinstance(item, str) or not isinstance(item, Iterable):
        raise WorkflowDefinitionError(f"Expected a step or a group of steps, not {item!r}.")
    found = list(item)
    for step in found:
        if not isinstance(step, Step):
            raise WorkflowDefinitionError(f"Expected a step, not {step!r}.")
    return found


def group(*steps: Step | Iterable[Step]) -> list[Step]:
    """Steps that run side by side (a fan-out): in a :func:`chain`, all after the item
    before the group, and the item after the group after all of them."""
    return [step for item in steps for step in _steps(item)]


def chain(*items: Step | Iterable[Step]) -> list[Step]:
    """Each item (a step or a :func:`group`) after the one before it; returns every step.

    Sets ``after`` on the steps (in place): ``chain(a, group(b, c), d)`` runs ``b`` and
    ``c`` after ``a``, and ``d`` after both (a fan-in, Celery's chord).
    """
    previous: list[Step] = []
    every: list[Step] = []
    for item in items:
        current = _steps(item)
        if not current:
            raise WorkflowDefinitionError("chain() got an empty group.")
        for step in current:
            step.after.extend(parent for parent in previous if parent not in step.after)
        every.extend(current)
        previous = current
    return every


def flatten(steps: Iterable[Step | Iterable[Step]], on_failure: OnFailure) -> list[Step]:
    """Every step of the workflow, named, its parents as names, in an order where each step
    comes after its parents; steps named in ``after`` as objects are included.

    Raises :class:`WorkflowDefinitionError` for a duplicate name, a parent that is not a
    step of the workflow, a cycle, or arguments that are not JSON.
    """
    found: list[Step] = []
    seen: set[int] = set()
    pending = [step for item in steps for step in _steps(item)]
    while pending:
        step = pending.pop(0)
        if id(step) in seen:
            continue
        seen.add(id(step))
        found.append(step)
        pending.extend(parent for parent in step.after if isinstance(parent, Step))
    if not found:
        raise WorkflowDefinitionError("A workflow needs at least one step.")
    _name(found)
    for step in found:
        if step.on_failure is None:
            step.on_failure = on_failure
        try:
            check_payload(step.arguments, f"arguments of step {step.name!r}")
        except InvalidArgumentError as exc:
            raise WorkflowDefinitionError(str(exc)) from exc
    return _ordered(found)


def _name(steps: list[Step]) -> None:
    """Name the unnamed steps (``<target's last part>-<n>``); refuse a name used twice."""
    names = [str(step.name) for step in steps if step.name is not None]
    taken = set(names)
    if len(taken) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise WorkflowDefinitionError(f"Two steps of the workflow are named {twice[0]!r}.")
    counter = 0
    for step in steps:
        if step.name is None:
            base = step.target.rsplit(".", 1)[-1][: MAX_NAME - 12] or str(step.kind)
            while True:
                counter += 1
                candidate = f"{base}-{counter}"
                if candidate not in taken:
                    break
            step.name = candidate
            taken.add(candidate)


def _ordered(steps: list[Step]) -> list[Step]:
    """``steps`` with their ``after`` as names, parents first (Kahn); refuse unknown
    parents and cycles."""
    by_name = {str(step.name): step for step in steps}
    for step in steps:
        parents: list[Step | str] = []
        for parent in step.after:
            parent_name = str(parent.name) if isinstance(parent, Step) else parent
            if parent_name not in by_name:
                raise WorkflowDefinitionError(
                    f"Step {step.name!r} runs after {parent_name!r}, which is not a step of "
                    f"the workflow. Known steps: {', '.join(map(repr, sorted(by_name)))}."
                )
            if parent_name == step.name:
                raise WorkflowDefinitionError(f"Step {step.name!r} runs after itself.")
            if parent_name not in parents:
                parents.append(parent_name)
        step.after = parents
    ordered: list[Step] = []
    done: set[str] = set()
    remaining = list(steps)
    while remaining:
        ready = [step for step in remaining if all(parent in done for parent in step.after)]
        if not ready:
            cycle = sorted(str(step.name) for step in remaining)
            raise WorkflowDefinitionError(
                f"The steps {', '.join(map(repr, cycle))} depend on each other in a cycle "
                f"(or on a step of one); a workflow is acyclic."
            )
        ordered.extend(ready)
        done.update(str(step.name) for step in ready)
        remaining = [step for step in remaining if step.name not in done]
    return ordered
