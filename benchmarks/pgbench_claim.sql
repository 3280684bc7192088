-- The raw ceiling: claim one due task and finish it in one transaction (one statement).
-- Run by benchmarks/throughput.py as `pgbench -n -f pgbench_claim.sql -c 4 -j 2 -t N` on the
-- project's own task table, filled with pending tasks of the topic "noop". The claim is the
-- node's claim query (same WHERE, same ORDER BY, so the same partial index) with
-- FOR UPDATE SKIP LOCKED; no ORM, no owner, no heartbeat, no batching.
-- clock_timestamp() stamps started_at/finished_at so the drain is timed like the node's.
UPDATE django_tasks_coord_task
SET state = 40, attempts = attempts + 1, exec_id = gen_random_uuid(),
    started_at = clock_timestamp(), finished_at = clock_timestamp()
WHERE sequence = (
    SELECT sequence FROM django_tasks_coord_task
    WHERE topic_id = 'noop' AND state = 10 AND (execute_at IS NULL OR execute_at <= now())
    ORDER BY priority DESC, sequence
    LIMIT 1
    FOR UPDATE SKIP LOCKED
);
