"""Composite task types: a DAG of named steps run over each batch of tasks.

::

    from django_tasks_coord import handlers
    from django_tasks_coord.composite import Composite, Step

    flow = Composite(
        {
            "fetch": Step(fetch),
            "parse": Step(parse, after=["fetch"]),
            "thumbs": Step(thumbs, after=["fetch"]),
            "store": Step(store, after=["parse", "thumbs"]),
        },
        supplement=make_supplement,  # called once per batch: make_supplement(tasks)
        max_parallel=4,  # threads for independent steps
    )
    handlers.register("documents", flow, batch=True)

A step is ``fn(task, supplement)`` (or, with ``batch=True``, ``fn(tasks, supplement)``)
and returns what a handler returns: None (SUCCESS), a :class:`Result` or a
:class:`Decision`; raising fails the task with the exception. A task's final
decision combines the decisions of the steps that ran for it, worst result
first (:func:`combine`). Semantics in detail: docs/composite.md.

**Steps resume.** For a task that carries a claim (one a node or ``queue.poll`` handed
out), each step that ends SUCCESS or FILTER is recorded as a checkpoint of the task
(:mod:`django_tasks_coord.running`, named ``tasks_coord.composite:<step>``) as soon as it
returns. When the task runs again (retried, or recovered after its node died), the steps
recorded by an earlier attempt are not called: their decisions are restored from the
checkpoints, and the steps after them run. A step whose checkpoint is refused because the
claim was lost fails the task with the :class:`~django_tasks_coord.exceptions.StaleClaimError`
(its dependents do not run).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, overload

from django.db import connections

from django_tasks_coord import running
from django_tasks_coord.enums import Decision, Result
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.handlers import HandlerResultError, Outcome, as_decision
from django_tasks_coord.models import Task
from django_tasks_coord.resume import CHECKPOINT_PREFIX, record, restored_decisions

__all__ = ["CHECKPOINT_PREFIX", "RESULT_PRIORITY", "Composite", "Step", "StepFunc", "combine"]

#: How bad each result is; the highest wins in :func:`combine`:
#: FAILURE > SUSPENSION > FILTER > SUCCESS.
RESULT_PRIORITY: Mapping[Result, int] = MappingProxyType(
    {Result.SUCCESS: 0, Result.FILTER: 1, Result.SUSPENSION: 2, Result.FAILURE: 3}
)

#: A step: ``fn(task, supplement) -> None | Result | Decision``, or with ``batch=True``
#: ``fn(tasks, supplement) -> None | Sequence[Outcome] | Mapping[sequence, Outcome]``.
StepFunc = (
    Callable[[Task, Any], Outcome]
    | Callable[[list[Task], Any], Sequence[Outcome] | Mapping[int, Outcome] | None]
)


def combine(decisions: Iterable[Decision] | Mapping[str, Decision]) -> Decision:
    """Merge several decisions into one: the worst result wins.

    - ``result``: the highest in :data:`RESULT_PRIORITY` (SUCCESS for no decisions).
    - ``message``: every decision's message (or, without one, its exception as
      ``"TypeName: text"``), in the given order, joined by ``"; "``; each prefixed with
      ``"label: "`` when ``decisions`` maps labels to decisions. None if there are none.
    - ``exception``: the exception of the highest-priority decision carrying one
      (the first one among equals).
    - ``continue_``: False; the combination is final.
    """
    if isinstance(decisions, Mapping):
        labelled: list[tuple[str | None, Decision]] = list(decisions.items())
    else:
        labelled = [(None, decision) for decision in decisions]
    for label, decision in labelled:
        if not isinstance(decision, Decision):
            where = f" for {label!r}" if label is not None else ""
            raise InvalidArgumentError(f"combine() takes Decisions, got {decision!r}{where}.")
    ranked = sorted((d for _, d in labelled), key=lambda d: -RESULT_PRIORITY[d.result])
    messages = []
    for label, decision in labelled:
        text = decision.message
        if text is None and decision.exception is not None:
            text = _describe(decision.exception)
        if text is not None:
            messages.append(text if label is None else f"{label}: {text}")
    return Decision(
        ranked[0].result if ranked else Result.SUCCESS,
        "; ".join(messages) if messages else None,
        next((d.exception for d in ranked if d.exception is not None), None),
    )


def _describe(exception: BaseException) -> str:
    text = str(exception)
    return f"{type(exception).__name__}: {text}" if text else type(exception).__name__


@dataclass(frozen=True, slots=True, init=False)
class Step:
    """One named step of a :class:`Composite`: a callable and the steps it runs after.

    ``after`` is a step name or an iterable of names. With ``batch=True`` the callable
    receives the list of tasks the step runs for (those not stopped earlier) and
    returns one outcome per task, like a batch handler.
    """

    func: Callable[..., Any]
    after: tuple[str, ...]
    batch: bool

    def __init__(self, func: StepFunc, after: str | Iterable[str] = (), *, batch: bool = False):
        if not callable(func):
            raise InvalidArgumentError(f"A step must be callable, not {func!r}.")
        names = (after,) if isinstance(after, str) else tuple(after)
        if not all(isinstance(name, str) for name in names):
            raise InvalidArgumentError(f"after= takes step names (str), not {after!r}.")
        object.__setattr__(self, "func", func)
        object.__setattr__(self, "after", tuple(dict.fromkeys(names)))
        object.__setattr__(self, "batch", bool(batch))

    def __repr__(self) -> str:
        name = getattr(self.func, "__qualname__", None) or repr(self.func)
        after = f", after={list(self.after)!r}" if self.after else ""
        return f"Step({name}{after}{', batch=True' if self.batch else ''})"


class Composite:
    """A batch handler running a DAG of named :class:`Step` objects for each batch of tasks.

    ``steps`` maps names to steps (a bare callable is taken as ``Step(func)``).
    ``supplement``, if given, is called once per batch with the list of tasks; its
    return value is passed to every step of that batch (None otherwise). Up to
    ``max_parallel`` steps whose dependencies are done run at once, each in a pool
    thread; ``max_parallel=1`` runs the steps one by one in the caller's thread, in
    the order of :attr:`steps`.

    Raises :class:`InvalidArgumentError` for an empty ``steps``, a dependency on an
    unknown step, a cycle (named in the message) or a bad ``max_parallel``.
    """

    def __init__(
        self,
        steps: Mapping[str, Step | StepFunc],
        *,
        supplement: Callable[[list[Task]], Any] | None = None,
        max_parallel: int = 4,
    ) -> None:
        if not isinstance(steps, Mapping) or not steps:
            raise InvalidArgumentError(
                f"A Composite needs a non-empty mapping of named steps, not {steps!r}."
            )
        if supplement is not None and not callable(supplement):
            raise InvalidArgumentError(f"supplement must be callable or None, not {supplement!r}.")
        if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
            raise InvalidArgumentError(f"max_parallel must be an int >= 1, not {max_parallel!r}.")
        declared = {name: _as_step(name, step) for name, step in steps.items()}
        self._order = _levels(declared)
        self._steps = MappingProxyType(
            {name: declared[name] for level in self._order for name in level}
        )
        self._dependents = {
            name: [d for d in self._steps if name in self._steps[d].after] for name in self._steps
        }
        self._position = {name: position for position, name in enumerate(self._steps)}
        self.supplement = supplement
        self.max_parallel = max_parallel

    @property
    def steps(self) -> Mapping[str, Step]:
        """The steps by name, in execution order: level by level, declaration order within a level."""
        return self._steps

    @property
    def order(self) -> tuple[tuple[str, ...], ...]:
        """The topological levels: each step's dependencies all lie in earlier levels."""
        return self._order

    def __repr__(self) -> str:
        order = [list(level) for level in self._order]
        supplement = getattr(self.supplement, "__qualname__", self.supplement)
        extra = "" if supplement is None else f", supplement={supplement}"
        return f"Composite(order={order!r}{extra}, max_parallel={self.max_parallel})"

    @overload
    def __call__(self, tasks: Task) -> Decision: ...
    @overload
    def __call__(self, tasks: Sequence[Task]) -> list[Decision]: ...
    def __call__(self, tasks: Task | Sequence[Task]) -> Decision | list[Decision]:
        """Run the steps for a batch and return one decision per task, in order.

        Called with a single task (registered without ``batch=True``), the task is a
        batch of its own and one decision is returned.
        """
        if isinstance(tasks, Task):
            return self.run([tasks])[0]
        return self.run(list(tasks))

    def run(self, tasks: list[Task]) -> list[Decision]:
        """Run the steps for ``tasks`` and return one combined decision per task, in order.

        Exceptions raised by steps or the supplement never escape: they fail tasks.
        """
        if not tasks:
            return []
        try:
            supplement = None if self.supplement is None else self.supplement(tasks)
        except Exception as exc:  # noqa: BLE001 - the batch fails, the node goes on
            return [combine({"supplement": Decision.failure(exc)}) for _ in tasks]
        restored = restored_decisions(tasks)
        ran: dict[str, dict[int, Decision]] = {}
        if self.max_parallel == 1 or all(len(level) == 1 for level in self._order):
            for name in self._steps:
                ran[name] = self._run_step(
                    name, self._eligible(name, ran, len(tasks)), tasks, supplement, restored
                )
        else:
            self._run_parallel(ran, tasks, supplement, restored)
        return [
            combine({name: ran[name][i] for name in self._steps if i in ran[name]})
            for i in range(len(tasks))
        ]

    def _run_parallel(
        self,
        ran: dict[str, dict[int, Decision]],
        tasks: list[Task],
        supplement: Any,
        restored: Mapping[int, Mapping[str, Decision]],
    ) -> None:
        waiting = {name: set(step.after) for name, step in self._steps.items()}
        ready = [name for name, deps in waiting.items() if not deps]
        running: dict[Future[dict[int, Decision]], str] = {}

        def finish(name: str, decisions: dict[int, Decision]) -> None:
            ran[name] = decisions
            for dependent in self._dependents[name]:
                waiting[dependent].discard(name)
                if not waiting[dependent]:
                    ready.append(dependent)

        with ThreadPoolExecutor(self.max_parallel, thread_name_prefix="tasks-coord-step") as pool:
            while ready or running:
                while ready:
                    name = ready.pop(0)
                    indexes = self._eligible(name, ran, len(tasks))
                    if indexes:
                        # In the caller's context: running.* inside a step sees its tasks.
                        context = contextvars.copy_context()
                        running[
                            pool.submit(
                                context.run,
                                self._run_in_thread,
                                name,
                                indexes,
                                tasks,
                                supplement,
                                restored,
                            )
                        ] = name
                    else:  # stopped for every task: nothing to run, release the dependents
                        finish(name, {})
                if running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in sorted(done, key=lambda f: self._position[running[f]]):
                        finish(running.pop(future), future.result())

    def _eligible(
        self, name: str, ran: Mapping[str, Mapping[int, Decision]], count: int
    ) -> list[int]:
        """Indexes of the tasks for which every dependency of ``name`` ran and did not stop."""
        return [
            i
            for i in range(count)
            if all(i in ran[dep] and not _stops(ran[dep][i]) for dep in self._steps[name].after)
        ]

    def _run_in_thread(
        self,
        name: str,
        indexes: list[int],
        tasks: list[Task],
        supplement: Any,
        restored: Mapping[int, Mapping[str, Decision]],
    ) -> dict[int, Decision]:
        try:
            return self._run_step(name, indexes, tasks, supplement, restored)
        finally:
            # Pool threads end with the batch; close the connections a step opened in this thread.
            connections.close_all()

    def _run_step(
        self,
        name: str,
        indexes: list[int],
        tasks: list[Task],
        supplement: Any,
        restored: Mapping[int, Mapping[str, Decision]],
    ) -> dict[int, Decision]:
        """Step ``name`` for the tasks at ``indexes``: restored where an earlier attempt
        recorded it, else run (and recorded); one decision per index."""
        decisions = {i: restored[i][name] for i in indexes if name in restored.get(i, {})}
        to_run = [i for i in indexes if i not in decisions]
        for i, decision in self._call_step(name, to_run, tasks, supplement).items():
            decisions[i] = record(tasks[i], name, decision)
        return {i: decisions[i] for i in indexes}

    def _call_step(
        self, name: str, indexes: list[int], tasks: list[Task], supplement: Any
    ) -> dict[int, Decision]:
        """Run step ``name`` for the tasks at ``indexes``; one decision per index."""
        step = self._steps[name]
        if not indexes:
            return {}
        if not step.batch:
            return {i: _call(name, step.func, tasks[i], supplement) for i in indexes}
        chosen = [tasks[i] for i in indexes]
        try:
            outcome = step.func(chosen, supplement)
            if outcome is None:
                return dict.fromkeys(indexes, Decision(Result.SUCCESS))
            if isinstance(outcome, Mapping):
                return {i: as_decision(outcome.get(tasks[i].sequence), name) for i in indexes}
            outcomes = list(outcome)
            if len(outcomes) != len(indexes):
                raise HandlerResultError(
                    f"Batch step {name!r} returned {len(outcomes)} outcomes for {len(indexes)} tasks."
                )
            return {i: as_decision(item, name) for i, item in zip(indexes, outcomes, strict=True)}
        except Exception as exc:  # noqa: BLE001 - the step's tasks fail, the others go on
            return dict.fromkeys(indexes, Decision.failure(exc))


def _call(name: str, func: Callable[..., Any], task: Task, supplement: Any) -> Decision:
    try:
        return as_decision(func(task, supplement), name)
    except Exception as exc:  # noqa: BLE001 - this task fails at this step, the others go on
        return Decision.failure(exc)


def _stops(decision: Decision) -> bool:
    """Whether a step's decision keeps the task from the steps after it (a raise is FAILURE without continue_)."""
    return decision.result is not Result.SUCCESS and not decision.continue_


def _as_step(name: object, step: object) -> Step:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"Step names must be non-empty strings, not {name!r}.")
    longest = running.CHECKPOINT_NAME_MAX_LENGTH - len(CHECKPOINT_PREFIX)
    if len(name) > longest:
        raise InvalidArgumentError(
            f"Step names have at most {longest} characters (they name checkpoints), "
            f"not {len(name)}: {name[:40]!r}..."
        )
    if isinstance(step, Step):
        return step
    if callable(step):
        return Step(step)
    raise InvalidArgumentError(f"Step {name!r} must be a Step or a callable, not {step!r}.")


def _levels(steps: Mapping[str, Step]) -> tuple[tuple[str, ...], ...]:
    """Group ``steps`` in topological levels; InvalidArgumentError for unknown names and cycles."""
    for name, step in steps.items():
        for dep in step.after:
            if dep not in steps:
                known = ", ".join(repr(n) for n in steps)
                raise InvalidArgumentError(
                    f"Step {name!r} runs after unknown step {dep!r}; the steps are {known}."
                )
    placed: set[str] = set()
    levels: list[tuple[str, ...]] = []
    while len(placed) < len(steps):
        level = tuple(
            name
            for name, step in steps.items()
            if name not in placed and all(dep in placed for dep in step.after)
        )
        if not level:
            raise InvalidArgumentError(f"The steps form a cycle: {_cycle(steps, placed)}.")
        placed.update(level)
        levels.append(level)
    return tuple(levels)


def _cycle(steps: Mapping[str, Step], placed: set[str]) -> str:
    """Describe one cycle among the unplaced steps in execution order, from its first-declared step."""
    path = [next(name for name in steps if name not in placed)]
    while True:
        following = next(dep for dep in steps[path[-1]].after if dep not in placed)
        if following in path:
            cycle = path[path.index(following) :][::-1]  # dependencies first
            first = cycle.index(min(cycle, key=list(steps).index))
            cycle = cycle[first:] + cycle[:first]
            return " -> ".join(repr(name) for name in [*cycle, cycle[0]])
        path.append(following)
