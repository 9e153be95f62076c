-- A claim whose plan does not depend on the outbox's statistics, so a backlog does not slow it
-- down (SPEC 3); measured in docs/BENCHMARKS.md. Same signature, results and semantics as 001.
-- Claims up to max_rows pending updates of the given apps for one replica, as a lease (SPEC 3).
-- Claims are serialised between replicas by an advisory lock; a key is skipped while any of its
-- updates is claimed under a live lease or backing off, so per-key order holds across replicas.
CREATE OR REPLACE FUNCTION events.claim(replica text, apps text[], max_rows integer, lease interval)
RETURNS TABLE ("position" bigint, id uuid, app_id text, key text, envelope text,
               created_at timestamptz, attempts integer)
LANGUAGE plpgsql
-- The plan must not depend on statistics: an outbox is a queue, often empty when autovacuum
-- analyzes it, and with such statistics every claim read the whole backlog. Index scans only: the
-- primary key in position order (stops after max_rows), the partial indexes for blocked keys.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
BEGIN
  PERFORM pg_advisory_xact_lock(7301, 1);
  RETURN QUERY
  WITH picked AS (
    SELECT o.position FROM events.outbox o
     WHERE o.app_id = ANY(claim.apps) AND o.topic = 'live'
       -- NOT IN over a subquery runs as one hashed SubPlan: O(scanned + blocked). No app filter in
       -- it (pairs of other apps never match): with one, the planner may read the whole backlog.
       AND (o.app_id, o.key) NOT IN (
         SELECT b.app_id, b.key FROM events.outbox b WHERE b.claimed_until > now()
         UNION ALL
         SELECT b.app_id, b.key FROM events.outbox b WHERE b.retry_at > now())
     ORDER BY o.position
     LIMIT claim.max_rows
  )
  UPDATE events.outbox u
     SET claimed_by = claim.replica, claimed_until = now() + claim.lease
    FROM picked
   WHERE u.position = picked.position
  RETURNING u.position, u.id, u.app_id, u.key, u.envelope::text, u.created_at, u.attempts;
END;
$$;
