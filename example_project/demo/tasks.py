"""What the demo declares in ``tasks.py``: a Django ``@task`` and a task definition.

Nodes and the HTTP API import every installed app's ``tasks.py`` at start-up.
"""

from django.tasks import task

from django_tasks_coord import definitions

#: Run by example_project/executor.py, an executor outside Django that speaks HTTP.
THUMBNAIL = "demo/thumbnail"

definitions.define(
    THUMBNAIL,
    description="Render a thumbnail of an image (done by example_project/executor.py).",
    params_schema={
        "type": "object",
        "properties": {"image": {"type": "string"}, "width": {"type": "integer", "minimum": 1}},
        "required": ["image", "width"],
    },
    result_schema={"type": "object", "required": ["thumbnail"]},
    error_schema={"type": "object", "required": ["code"]},
    requested_to_start_timeout=10,
    in_progress_timeout=30,
    allowed_retry_count=1,
    retry_delay=2,
    concurrency_limit=2,
)


@task()
def word_count(text: str) -> dict[str, int]:
    """A Django task: enqueued by ``manage.py demo`` at start and by the ``demo-feed`` job."""
    words = text.split()
    return {"words": len(words), "distinct": len({word.lower() for word in words})}
