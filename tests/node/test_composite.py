"""Composite task types: DAG validation, scheduling, result priority, continue_, supplements.

Pure unit tests: unsaved Task objects, no database.
"""

import threading

import pytest

from django_tasks_coord.composite import RESULT_PRIORITY, Composite, Step, combine
from django_tasks_coord.enums import Decision, Result
from django_tasks_coord.exceptions import InvalidArgumentError, TasksCoordError
from django_tasks_coord.handlers import HandlerResultError, TaskType
from django_tasks_coord.models import Task

TIMEOUT = 10  # seconds; only reached when a test is about to fail


def tasks(*identifiers):
    return [Task(topic_id="documents", identifier=i) for i in identifiers]


class Recorder:
    """Step functions that record (step, identifier) calls, thread-safely."""

    def __init__(self):
        self.calls = []
        self._lock = threading.Lock()

    def step(self, name, outcome=None):
        """A step that records its call and returns ``outcome`` (a callable gets the task)."""

        def run(task, supplement):
            with self._lock:
                self.calls.append((name, task.identifier))
            return outcome(task) if callable(outcome) else outcome

        run.__qualname__ = name
        return run

    def steps_for(self, identifier):
        return [name for name, ident in self.calls if ident == identifier]


def diamond(rec, **outcomes):
    return {
        "fetch": Step(rec.step("fetch", outcomes.get("fetch"))),
        "parse": Step(rec.step("parse", outcomes.get("parse")), after=["fetch"]),
        "thumbs": Step(rec.step("thumbs", outcomes.get("thumbs")), after="fetch"),
        "store": Step(rec.step("store", outcomes.get("store")), after=["parse", "thumbs"]),
    }


# --- the DAG -----------------------------------------------------------------------------


def test_order_is_topological_levels_in_declaration_order():
    rec = Recorder()
    steps = diamond(rec)
    flow = Composite({name: steps[name] for name in ["store", "thumbs", "parse", "fetch"]})
    assert flow.order == (("fetch",), ("thumbs", "parse"), ("store",))
    assert list(flow.steps) == ["fetch", "thumbs", "parse", "store"]


def test_repr_shows_order_supplement_and_parallelism():
    def make_supplement(batch):
        return None

    flow = Composite(diamond(Recorder()), supplement=make_supplement, max_parallel=2)
    assert repr(flow) == (
        "Composite(order=[['fetch'], ['parse', 'thumbs'], ['store']], "
        "supplement=test_repr_shows_order_supplement_and_parallelism.<locals>.make_supplement, "
        "max_parallel=2)"
    )
    assert repr(flow.steps["store"]) == "Step(store, after=['parse', 'thumbs'])"


def test_bare_callables_and_duplicate_dependencies_are_accepted():
    rec = Recorder()
    flow = Composite({"a": rec.step("a"), "b": Step(rec.step("b"), after=["a", "a"])})
    assert flow.steps["b"].after == ("a",)
    assert flow(tasks("x")) == [Decision(Result.SUCCESS)]


def test_unknown_dependency_is_named():
    with pytest.raises(InvalidArgumentError) as caught:
        Composite({"fetch": Step(print), "parse": Step(print, after=["fecth"])})
    assert str(caught.value) == (
        "Step 'parse' runs after unknown step 'fecth'; the steps are 'fetch', 'parse'."
    )


def test_cycle_is_named_in_execution_order():
    with pytest.raises(InvalidArgumentError) as caught:
        Composite(
            {
                "root": Step(print),
                "tail": Step(print, after=["b"]),  # depends on the cycle, is not part of it
                "a": Step(print, after=["root", "c"]),
                "b": Step(print, after=["a"]),
                "c": Step(print, after=["b"]),
            }
        )
    assert str(caught.value) == "The steps form a cycle: 'a' -> 'b' -> 'c' -> 'a'."


def test_self_dependency_is_a_cycle():
    with pytest.raises(InvalidArgumentError, match=r"cycle: 'a' -> 'a'\.$"):
        Composite({"a": Step(print, after="a")})


@pytest.mark.parametrize(
    ("steps", "options", "match"),
    [
        ({}, {}, "non-empty mapping of named steps"),
        ([Step(print)], {}, "non-empty mapping of named steps"),
        ({"": Step(print)}, {}, "non-empty strings"),
        ({"a": 42}, {}, "Step 'a' must be a Step or a callable, not 42"),
        ({"a": Step(print)}, {"max_parallel": 0}, "max_parallel must be an int >= 1, not 0"),
        ({"a": Step(print)}, {"max_parallel": True}, "max_parallel"),
        ({"a": Step(print)}, {"max_parallel": "2"}, "max_parallel"),
        ({"a": Step(print)}, {"supplement": 42}, "supplement must be callable"),
    ],
)
def test_invalid_composites_are_refused(steps, options, match):
    with pytest.raises(InvalidArgumentError, match=match):
        Composite(steps, **options)


def test_invalid_steps_are_refused():
    with pytest.raises(InvalidArgumentError, match="must be callable"):
        Step(42)
    with pytest.raises(InvalidArgumentError, match="step names"):
        Step(print, after=[1])
    assert issubclass(InvalidArgumentError, TasksCoordError)


# --- scheduling --------------------------------------------------------------------------


def test_sequential_runs_step_by_step_in_the_callers_thread():
    rec = Recorder()
    threads = set()
    steps = diamond(rec)
    steps["fetch"] = Step(lambda task, s: threads.add(threading.get_ident()))
    flow = Composite(steps, max_parallel=1)
    assert flow(tasks("a", "b")) == [Decision(Result.SUCCESS)] * 2
    assert rec.calls == [
        ("parse", "a"),
        ("parse", "b"),
        ("thumbs", "a"),
        ("thumbs", "b"),
        ("store", "a"),
        ("store", "b"),
    ]
    assert threads == {threading.get_ident()}


def test_independent_steps_overlap():
    # Each waits for the other at the barrier: this only passes if both run at the same time.
    barrier = threading.Barrier(2, timeout=TIMEOUT)

    def meet(task, supplement):
        barrier.wait()  # BrokenBarrierError after TIMEOUT if the other step is not running

    rec = Recorder()
    steps = diamond(rec)
    steps["parse"] = Step(meet, after="fetch")
    steps["thumbs"] = Step(meet, after="fetch")
    flow = Composite(steps, max_parallel=2)
    assert flow(tasks("a")) == [Decision(Result.SUCCESS)]
    assert rec.calls == [("fetch", "a"), ("store", "a")]


def test_a_step_starts_as_soon_as_its_own_dependencies_are_done():
    # "slow" waits until "after_fast" ran: that needs "after_fast" not to wait for "slow".
    fast_done = threading.Event()

    def slow(task, supplement):
        if not fast_done.wait(TIMEOUT):
            raise TimeoutError("after_fast waited for slow")

    flow = Composite(
        {
            "fast": Step(lambda task, s: None),
            "slow": Step(slow),
            "after_fast": Step(lambda task, s: fast_done.set(), after="fast"),
        },
        max_parallel=2,
    )
    assert flow(tasks("a")) == [Decision(Result.SUCCESS)]


def test_a_step_waits_for_all_its_dependencies_in_parallel_mode():
    rec = Recorder()
    flow = Composite(diamond(rec), max_parallel=4)
    flow(tasks("a", "b"))
    for ident in "ab":
        order = rec.steps_for(ident)
        assert order[0] == "fetch"
        assert order[-1] == "store"
        assert sorted(order[1:3]) == ["parse", "thumbs"]


@pytest.mark.parametrize("max_parallel", [1, 3])
def test_messages_follow_step_order_whatever_finishes_first(max_parallel):
    # "thumbs" finishes before "parse" starts its message: the order stays topological.
    thumbs_done = threading.Event()

    def parse(task, supplement):
        if max_parallel > 1:
            thumbs_done.wait(TIMEOUT)
        return Decision(Result.SUCCESS, "parsed")

    def thumbs(task, supplement):
        thumbs_done.set()
        return Decision(Result.SUCCESS, "thumbed")

    flow = Composite({"parse": Step(parse), "thumbs": Step(thumbs)}, max_parallel=max_parallel)
    assert flow(tasks("a")) == [Decision(Result.SUCCESS, "parse: parsed; thumbs: thumbed")]


def test_works_as_a_batch_handler_and_as_a_single_handler():
    rec = Recorder()
    flow = Composite(diamond(rec, parse=Result.FILTER))
    batch = TaskType(name="documents", func=flow, batch=True)
    assert batch.run(tasks("a", "b")) == [Decision(Result.FILTER)] * 2
    single = TaskType(name="documents", func=flow)
    assert single.run(tasks("c")) == [Decision(Result.FILTER)]
    assert flow(tasks("d")[0]) == Decision(Result.FILTER)
    assert flow([]) == []


# --- outcomes, priority, continue_ -------------------------------------------------------


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        ([], Result.SUCCESS),
        ([Result.SUCCESS, Result.SUCCESS], Result.SUCCESS),
        ([Result.SUCCESS, Result.FILTER], Result.FILTER),
        ([Result.FILTER, Result.SUSPENSION], Result.SUSPENSION),
        ([Result.SUSPENSION, Result.FILTER, Result.SUCCESS], Result.SUSPENSION),
        ([Result.SUCCESS, Result.FAILURE, Result.SUSPENSION], Result.FAILURE),
    ],
)
def test_combine_worst_result_wins(results, expected):
    assert combine(Decision(r) for r in results).result == expected


def test_result_priority_order():
    assert sorted(Result, key=RESULT_PRIORITY.__getitem__) == [
        Result.SUCCESS,
        Result.FILTER,
        Result.SUSPENSION,
        Result.FAILURE,
    ]
    with pytest.raises(TypeError):
        RESULT_PRIORITY[Result.SUCCESS] = 9  # type: ignore[index]


def test_combine_messages_and_exception():
    low, high = ValueError("low"), KeyError("high")
    combined = combine(
        {
            "a": Decision(Result.SUCCESS, "fine"),
            "b": Decision(Result.SUSPENSION, exception=low),
            "c": Decision(Result.SUCCESS),
            "d": Decision(Result.FAILURE, "broken", high),
            "e": Decision(Result.FAILURE, exception=RuntimeError("later")),
            "f": Decision(Result.FAILURE, exception=TimeoutError()),
        }
    )
    assert combined.result == Result.FAILURE
    assert combined.message == (
        "a: fine; b: ValueError: low; d: broken; e: RuntimeError: later; f: TimeoutError"
    )
    assert combined.exception is high
    assert combined.continue_ is False


def test_combine_keeps_a_lower_exception_when_the_worst_has_none():
    low = ValueError("low")
    combined = combine(
        [Decision(Result.FAILURE, "no exception"), Decision(Result.FILTER, exception=low)]
    )
    assert combined == Decision(Result.FAILURE, "no exception; ValueError: low", low)


def test_combine_refuses_non_decisions():
    with pytest.raises(InvalidArgumentError, match=r"got <Result\.FAILURE: 'failure'> for 'x'"):
        combine({"x": Result.FAILURE})


def test_a_non_success_decision_stops_the_dependents():
    rec = Recorder()
    flow = Composite(diamond(rec, parse=Decision(Result.FILTER, "irrelevant")), max_parallel=1)
    assert flow(tasks("a")) == [Decision(Result.FILTER, "parse: irrelevant")]
    # thumbs does not depend on parse: it still runs; store depends on both: it does not.
    assert rec.steps_for("a") == ["fetch", "parse", "thumbs"]


def test_stopping_is_transitive():
    rec = Recorder()
    flow = Composite(
        {
            "a": Step(rec.step("a", Result.SUSPENSION)),
            "b": Step(rec.step("b"), after="a"),
            "c": Step(rec.step("c"), after="b"),
        }
    )
    assert flow(tasks("x")) == [Decision(Result.SUSPENSION)]
    assert rec.calls == [("a", "x")]


def test_continue_lets_the_dependents_run_and_still_counts():
    rec = Recorder()
    flow = Composite(
        diamond(rec, fetch=Decision(Result.FILTER, "cached", continue_=True)), max_parallel=1
    )
    assert flow(tasks("a")) == [Decision(Result.FILTER, "fetch: cached")]
    assert rec.steps_for("a") == ["fetch", "parse", "thumbs", "store"]


def test_a_worse_later_step_wins_over_a_continued_one():
    rec = Recorder()
    flow = Composite(
        diamond(
            rec,
            fetch=Decision(Result.SUSPENSION, "partial", continue_=True),
            store=Decision.failure(message="disk full"),
        )
    )
    assert flow(tasks("a")) == [Decision(Result.FAILURE, "fetch: partial; store: disk full")]


def test_a_returned_failure_may_continue():
    rec = Recorder()
    flow = Composite(
        {
            "a": Step(rec.step("a", Decision(Result.FAILURE, "soft", continue_=True))),
            "b": Step(rec.step("b"), after="a"),
        }
    )
    assert flow(tasks("x")) == [Decision(Result.FAILURE, "a: soft")]
    assert rec.calls == [("a", "x"), ("b", "x")]


def test_a_raising_step_fails_the_task_and_stops_its_dependents():
    rec = Recorder()
    error = ValueError("bad page")

    def parse(task):
        raise error

    flow = Composite(diamond(rec, parse=parse))
    [decision] = flow(tasks("a"))
    assert decision == Decision(Result.FAILURE, "parse: ValueError: bad page", error)
    assert sorted(rec.steps_for("a")) == ["fetch", "parse", "thumbs"]


def test_an_invalid_return_value_fails_the_task():
    flow = Composite({"a": Step(lambda task, s: 42)})
    [decision] = flow(tasks("x"))
    assert decision.result == Result.FAILURE
    assert isinstance(decision.exception, HandlerResultError)
    assert "returned 42" in decision.message


def test_one_tasks_failure_does_not_affect_the_others():
    rec = Recorder()

    def parse(task):
        if task.identifier == "bad":
            raise ValueError("bad")
        return Decision(Result.SUCCESS, f"parsed {task.identifier}")

    flow = Composite(diamond(rec, parse=parse), max_parallel=2)
    good1, bad, good2 = flow(tasks("good1", "bad", "good2"))
    assert bad.result == Result.FAILURE
    assert good1 == Decision(Result.SUCCESS, "parse: parsed good1")
    assert good2 == Decision(Result.SUCCESS, "parse: parsed good2")
    assert "store" not in rec.steps_for("bad")
    assert rec.steps_for("good1")[-1] == rec.steps_for("good2")[-1] == "store"


# --- the supplement ----------------------------------------------------------------------


def test_the_supplement_is_made_once_per_batch_and_shared():
    made, seen = [], []
    lock = threading.Lock()

    def supplement(batch):
        made.append([t.identifier for t in batch])
        return object()

    def record(task, supp):
        with lock:
            seen.append(supp)

    flow = Composite(
        {"a": Step(record), "b": Step(record), "c": Step(record, after=["a", "b"])},
        supplement=supplement,
        max_parallel=2,
    )
    flow(tasks("x", "y"))
    flow(tasks("z"))
    assert made == [["x", "y"], ["z"]]
    assert len(seen) == 9  # 3 steps x 2 tasks, then 3 steps x 1 task
    first, second = {id(s) for s in seen[:6]}, {id(s) for s in seen[6:]}
    assert len(first) == len(second) == 1
    assert first != second


def test_without_a_supplement_steps_get_none():
    seen = []
    Composite({"a": Step(lambda task, s: seen.append(s))})(tasks("x"))
    assert seen == [None]


def test_an_empty_batch_makes_no_supplement():
    def supplement(batch):
        raise AssertionError("not called")

    assert Composite({"a": Step(print)}, supplement=supplement)([]) == []


def test_a_failing_supplement_fails_every_task_of_the_batch():
    rec = Recorder()
    error = ConnectionError("no cache")

    def supplement(batch):
        raise error

    flow = Composite(diamond(rec), supplement=supplement)
    expected = Decision(Result.FAILURE, "supplement: ConnectionError: no cache", error)
    assert flow(tasks("a", "b")) == [expected, expected]
    assert rec.calls == []


# --- batch steps -------------------------------------------------------------------------


def test_a_batch_step_gets_the_tasks_still_running_and_answers_for_each():
    received = []

    def fetch(task, supplement):
        return Result.FILTER if task.identifier == "skip" else None

    def store(batch, supplement):
        received.append(([t.identifier for t in batch], supplement))
        return [Decision(Result.SUCCESS, f"stored {t.identifier}") for t in batch]

    flow = Composite(
        {"fetch": Step(fetch), "store": Step(store, after="fetch", batch=True)},
        supplement=lambda batch: "supp",
    )
    assert flow(tasks("a", "skip", "b")) == [
        Decision(Result.SUCCESS, "store: stored a"),
        Decision(Result.FILTER),
        Decision(Result.SUCCESS, "store: stored b"),
    ]
    assert received == [(["a", "b"], "supp")]


def test_a_batch_step_may_answer_by_sequence_or_with_none():
    batch = tasks("a", "b")
    batch[0].sequence, batch[1].sequence = 11, 12
    flow = Composite(
        {
            "first": Step(lambda ts, s: None, batch=True),
            "second": Step(lambda ts, s: {12: Result.SUSPENSION}, after="first", batch=True),
        }
    )
    assert flow(batch) == [Decision(Result.SUCCESS), Decision(Result.SUSPENSION)]


def test_a_batch_step_is_not_called_when_every_task_stopped():
    called = []
    flow = Composite(
        {
            "a": Step(lambda task, s: Result.FILTER),
            "b": Step(lambda ts, s: called.append(ts), after="a", batch=True),
        },
        max_parallel=2,
    )
    assert flow(tasks("x", "y")) == [Decision(Result.FILTER)] * 2
    assert called == []


def test_a_batch_step_that_fails_fails_its_tasks_only():
    error = RuntimeError("boom")

    def explode(batch, supplement):
        raise error

    flow = Composite(
        {
            "fetch": Step(lambda task, s: Result.FILTER if task.identifier == "skip" else None),
            "store": Step(explode, after="fetch", batch=True),
        }
    )
    ok, skipped = flow(tasks("ok", "skip"))
    assert ok == Decision(Result.FAILURE, "store: RuntimeError: boom", error)
    assert skipped == Decision(Result.FILTER)


def test_a_batch_step_with_the_wrong_number_of_outcomes_fails():
    flow = Composite({"a": Step(lambda ts, s: [None], batch=True)})
    decisions = flow(tasks("x", "y"))
    assert {d.result for d in decisions} == {Result.FAILURE}
    assert isinstance(decisions[0].exception, HandlerResultError)
    assert decisions[0].message == (
        "a: HandlerResultError: Batch step 'a' returned 1 outcomes for 2 tasks."
    )


# --- database connections ----------------------------------------------------------------


class FakeConnections:
    def __init__(self):
        self.closed_in = []

    def close_all(self):
        self.closed_in.append(threading.get_ident())


@pytest.mark.parametrize("max_parallel", [1, 2])
def test_pool_threads_close_their_connections_the_callers_are_left_alone(monkeypatch, max_parallel):
    fake = FakeConnections()
    monkeypatch.setattr("django_tasks_coord.composite.connections", fake)
    ran_in = []
    step = Step(lambda task, s: ran_in.append(threading.get_ident()))
    Composite({"a": step, "b": step}, max_parallel=max_parallel)(tasks("x"))
    if max_parallel == 1:
        assert fake.closed_in == []
    else:
        assert sorted(fake.closed_in) == sorted(ran_in)
        assert threading.get_ident() not in ran_in
