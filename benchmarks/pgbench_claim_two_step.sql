-- Informational: what a one-task-at-a-time worker really does, two transactions per task:
-- claim it (ACTIVE, committed before the work runs), then finish it. Same table and claim
-- query as pgbench_claim.sql. The claim always returns one row (0 once the queue is empty:
-- an aggregate over no rows), so a client that finds nothing left does not abort; the
-- finish then matches no row.
WITH claimed AS (
    UPDATE django_tasks_coord_task
    SET state = 30, attempts = attempts + 1, exec_id = gen_random_uuid(),
        started_at = clock_timestamp()
    WHERE sequence = (
        SELECT sequence FROM django_tasks_coord_task
        WHERE topic_id = 'noop' AND state = 10 AND (execute_at IS NULL OR execute_at <= now())
        ORDER BY priority DESC, sequence
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING sequence
)
SELECT coalesce(max(sequence), 0) AS claimed FROM claimed \gset
UPDATE django_tasks_coord_task SET state = 40, finished_at = clock_timestamp()
WHERE sequence = :claimed AND state = 30;
