"""The admin in a real browser: headless Chromium (Debian's package) driven by Playwright.

Log in, pause a topic, revive a failed task, run a job now, see the dashboard chart and
backlog; the task list fits 1280 px; a finished job says so; a declared job is read-only.
Screenshots go to a temporary directory, or to docs/images/ (used by docs/admin.md) when
``UPDATE_SCREENSHOTS=1``. Skipped, with the reason shown, where no Chromium is installed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from django_tasks_coord import coordination, queue, scheduling
from django_tasks_coord.enums import Decision, TaskState
from django_tasks_coord.models import PeriodicTask, Task, Topic
from django_tasks_coord.scheduling import JOBS_TOPIC
from tests.factories import OwnerFactory, TaskFactory, TopicFactory

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None,
        reason=f"no Chromium at {CHROMIUM}: install the Debian package chromium "
        "(.ci/run and ./run test do when they can)",
    ),
]


@pytest.fixture
def page(transactional_db, live_server, monkeypatch) -> Iterator[object]:
    # transactional_db first: the test database is then set up before the (session-wide)
    # live server and torn down after it, when the server's connections are closed.
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package")
    # Playwright's sync API runs an event loop in this thread; Django's ORM refuses to run
    # next to one unless told that this (test) code is synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        context = browser.new_context(
            viewport={"width": 1280, "height": 860}, base_url=live_server.url
        )
        context.set_default_timeout(15_000)
        yield context.new_page()
        browser.close()
        # The ORM calls made inside Playwright's event loop use connections of their own
        # (Django keeps connections per context there); close them, or PostgreSQL refuses
        # to drop the test database at the end ("being accessed by other users").
        connections.close_all()


@pytest.fixture
def shots(tmp_path) -> Path:
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        return DOCS_IMAGES
    return tmp_path


@pytest.fixture
def operations(transactional_db) -> dict[str, object]:
    """A small, realistic system: topics with work, a failed task, a job, a leader, nodes."""
    User.objects.create_superuser("admin", password="admin-pw")
    now = timezone.now()
    mail, reports = TopicFactory(name="mail"), TopicFactory(name="reports")
    for minute in range(0, 60, 2):
        for i in range(1 + minute % 7):
            TaskFactory(
                topic=mail if i % 2 else reports,
                state=TaskState.FAILED if (minute + i) % 23 == 0 else TaskState.SUCCEEDED,
                finished_at=now - timedelta(minutes=minute, seconds=10),
            )
    TaskFactory.create_batch(4, topic=mail)
    queue.push("mail", "invoice-42", {"customer": 42, "amount": "19.90"}, priority=5)
    (task,) = queue.poll("mail", owner=queue.register_owner("node-a"))
    try:
        raise ConnectionError("SMTP server refused the connection")
    except ConnectionError as exc:
        failed = queue.complete(task, Decision.failure(exc, "could not send invoice"))
    OwnerFactory(name="node-b")
    coordination.join("billing", "node-a")
    coordination.try_acquire("billing", "node-a", timedelta(seconds=30))
    job = scheduling.schedule_periodic(
        "tests.testapp.job_functions.noop", "Mon..Fri 09:00", job_id="daily-report", tz="UTC"
    )
    # What makes a task list wide: long identifiers, node ids and messages.
    busy = OwnerFactory(name="web-7f9c4d-worker.eu-west-1.compute.internal:48213:9f3a1c2b")
    for n in range(3):
        TaskFactory(
            topic=reports,
            identifier=f"report/2026-05/customer-{n:08d}/quarterly-revenue-by-region-and-product",
            state=TaskState.ACTIVE,
            owner=busy,
            exec_id=f"00000000-0000-0000-0000-00000000000{n}",
            attempts=1,
            started_at=now,
        )
    TaskFactory(
        topic=reports,
        identifier="report/2026-05/customer-00000042/quarterly-revenue-by-region-and-product",
        state=TaskState.FAILED,
        finished_at=now,
        message="Renderer crashed: the template 'quarterly.html' references a missing column "
        "'revenue_eur' (report schema v12); regenerate the schema or pin v11.",
    )
    for minutes in (95, 40, 3):  # pending reports of several ages: the oldest is 95 minutes old
        aged = TaskFactory(topic=reports)
        Task.objects.filter(pk=aged.pk).update(created_at=now - timedelta(minutes=minutes))
    return {"failed": failed, "job": job}


def log_in(page) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin-pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")


def test_log_in_and_see_the_index(page, operations, shots):
    log_in(page)
    assert page.locator("a", has_text="Dashboard").count() >= 1
    page.screenshot(path=str(shots / "admin-index.png"), full_page=True)


def test_pause_a_topic(page, operations, shots):
    log_in(page)
    page.goto("/admin/django_tasks_coord/topic/")
    page.screenshot(path=str(shots / "admin-topics.png"), full_page=True)
    page.click("text=mail")
    page.wait_for_selector("table.tc-states")
    page.click("button[data-action=pause]")
    page.wait_for_selector("text=Paused: 1 topic.")
    assert Topic.objects.get(pk="mail").paused
    assert page.locator("button[data-action=resume]").count() == 1


def test_revive_a_failed_task(page, operations, shots):
    failed = operations["failed"]
    log_in(page)
    page.goto(f"/admin/django_tasks_coord/task/?state__exact={TaskState.FAILED.value}")
    page.screenshot(path=str(shots / "admin-tasks.png"), full_page=True)
    page.goto(f"/admin/django_tasks_coord/task/{failed.pk}/change/")
    assert page.locator("text=SMTP server refused the connection").count() >= 1
    page.screenshot(path=str(shots / "admin-task.png"), full_page=True)
    page.click("button[data-action=recreate]")
    page.wait_for_selector("text=Recreated: 1 task.")
    copy = Task.objects.get(original=failed)
    assert (copy.state, copy.recreated) == (TaskState.PENDING, True)
    page.click(f".messagelist a:has-text('#{copy.pk}')")  # the message links the new task
    page.wait_for_url(f"**/task/{copy.pk}/change/")


def test_run_a_job_now(page, operations, shots):
    log_in(page)
    page.goto("/admin/django_tasks_coord/periodictask/")
    page.click("text=daily-report")
    page.wait_for_selector("ol.tc-elapses")
    assert page.locator("ol.tc-elapses li").count() == 5
    page.screenshot(path=str(shots / "admin-job.png"), full_page=True)
    page.click("button[data-action=run_now]")
    page.wait_for_selector("text=Run now: 1 periodic job.")
    run = Task.objects.get(topic_id=JOBS_TOPIC, identifier=operations["job"])
    assert (run.state, run.requester) == (TaskState.PENDING, "admin:admin")


def test_see_the_dashboard_chart(page, operations, shots):
    log_in(page)
    page.click("a:has-text('Dashboard')")
    page.wait_for_selector("svg.tc-chart")
    assert page.locator("svg.tc-chart[data-topic=mail] rect.tc-done").count() > 10
    assert page.locator("svg.tc-chart rect.tc-failed").count() >= 1
    assert page.locator("#tc-leaders", has_text="node-a").count() == 1
    assert page.locator("#tc-nodes", has_text="node-b").count() == 1
    assert page.locator('meta[http-equiv="refresh"]').count() == 1
    page.screenshot(path=str(shots / "admin-dashboard.png"), full_page=True)


def test_the_task_list_fits_1280_pixels(page, operations, shots):
    log_in(page)
    page.goto("/admin/django_tasks_coord/task/")
    page.wait_for_selector("#result_list")
    assert page.viewport_size["width"] == 1280
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280, f"the page is {width}px wide: it scrolls sideways"
    # Django's .results box scrolls sideways when the table is wider than it: it must not.
    scroll, client = page.evaluate(
        "(() => { const r = document.querySelector('#changelist .results');"
        " return [r.scrollWidth, r.clientWidth]; })()"
    )
    assert scroll <= client, f"the task table is {scroll}px wide in a {client}px box"
    box = page.locator("#changelist .results").bounding_box()
    for column in ("state", "message_short"):
        header = page.locator(f"#result_list th.column-{column}").bounding_box()
        assert header is not None and header["x"] >= box["x"]
        assert header["x"] + header["width"] <= box["x"] + box["width"], f"{column} is cut off"
    row = page.locator("#result_list tr", has_text="customer-00000042")
    assert row.locator("td.field-state").inner_text() == "failed"
    assert row.locator("td.field-message_short").inner_text().startswith("Renderer crashed")
    assert row.locator("td.field-message_short").bounding_box()["x"] < 1280
    page.screenshot(path=str(shots / "admin-tasks.png"))


def test_the_dashboard_backlog_matches_the_database(page, operations, shots):
    log_in(page)
    page.goto("/admin/django_tasks_coord/dashboard/")
    page.wait_for_selector("#tc-backlog")
    rows = page.locator("#tc-backlog tbody tr")
    shown = {
        rows.nth(i).get_attribute("data-topic"): (
            int(rows.nth(i).locator("td.tc-pending").inner_text()),
            int(rows.nth(i).locator("td.tc-active").inner_text()),
            rows.nth(i).locator("td.tc-oldest").inner_text(),
        )
        for i in range(rows.count())
    }
    expected = {}
    for topic in Topic.objects.exclude(name__startswith="tasks_coord.").order_by("name"):
        tasks = Task.objects.filter(topic=topic)
        expected[topic.name] = (
            tasks.filter(state=TaskState.PENDING).count(),
            tasks.filter(state__in=[TaskState.ACTIVE, TaskState.REQUESTED]).count(),
        )
    assert {topic: numbers[:2] for topic, numbers in shown.items()} == expected
    assert shown["reports"][:2] == (3, 3) and shown["reports"][2].startswith("1h 3")
    assert JOBS_TOPIC not in shown
    page.screenshot(path=str(shots / "admin-dashboard.png"), full_page=True)


def test_a_finished_job_shows_that_it_is_finished(page, operations, shots):
    scheduling.schedule_recurring(
        "tests.testapp.job_functions.noop", 3600, job_id="three-reminders", max_count=3
    )
    PeriodicTask.objects.filter(pk="three-reminders").update(
        run_count=3, enabled=False, finished_at=timezone.now(), nextrun=None
    )
    log_in(page)
    page.goto("/admin/django_tasks_coord/periodictask/three-reminders/change/")
    page.wait_for_selector("text=it will not run again.")
    assert page.locator("ol.tc-elapses").count() == 0
    assert page.locator("button[data-action=pause]").count() == 0
    assert page.locator("button[data-action=resume]").count() == 0
    assert page.locator("text=Finished: it will not run again").count() >= 1
    page.screenshot(path=str(shots / "admin-job-finished.png"), full_page=True)


def test_a_declared_job_has_no_save_or_delete(page, operations, shots):
    scheduling.schedule_periodic(
        "tests.testapp.job_functions.noop", "*-*-* 02:00", job_id="nightly-cleanup", declared=True
    )
    log_in(page)
    page.goto("/admin/django_tasks_coord/periodictask/nightly-cleanup/change/")
    page.wait_for_selector("ol.tc-elapses")
    assert page.locator("input[name=_save]").count() == 0
    assert page.locator("input[name=_continue]").count() == 0
    assert page.locator("a.deletelink").count() == 0
    assert page.locator("input[name=timer]").count() == 0  # read-only
    page.screenshot(path=str(shots / "admin-job-declared.png"), full_page=True)
