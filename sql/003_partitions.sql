-- Claims that write nothing per update (issue 15; docs/ARCHITECTURE.md "The outbox and the claim").
-- Keys are hashed into 64 partitions per app. A replica owns partitions through session-level
-- advisory locks, which Postgres releases by itself when the replica's connection dies, so the
-- owner reads its partitions' rows by position with no UPDATE; only a failed publish writes
-- (attempts, retry_at, last_error), and an ack deletes.

-- The partition of a key; fixed forever (changing it would move keys between owners mid-stream).
CREATE FUNCTION events.partition_of(key text)
RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (hashtextextended(key, 7302) & 63)::smallint $$;

-- Stored in the row at INSERT (generated, so every writer and a coalescing update that changes
-- the key get it right). Rewrites the table once; existing pending rows get their partition too.
ALTER TABLE events.outbox
  ADD COLUMN partition smallint NOT NULL GENERATED ALWAYS AS (events.partition_of(key)) STORED;

-- The owner's read: one app's rows in position order from its cursor on.
CREATE INDEX outbox_app_position_idx ON events.outbox (app_id, position);

-- The lock keys of an app: 64 partitions and one shared "member" lock that every replica serving
-- the app holds, so replicas count each other in pg_locks (a dead one's lock goes with it).
CREATE FUNCTION events.lock_base(app_id text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended('outlive/' || app_id, 7302) & ~127::bigint $$;

-- Per partition of the app: the backend pid that owns it (null: nobody), and the number of
-- replicas serving the app (holders of the member lock).
CREATE FUNCTION events.partition_owners(app_id text)
RETURNS TABLE (part integer, owner_pid integer, members integer)
LANGUAGE sql STABLE
AS $$
  WITH held AS (
    SELECT ((l.classid::int8 << 32) | l.objid::int8) - events.lock_base(partition_owners.app_id)
             AS slot, l.pid
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND ((l.classid::int8 << 32) | l.objid::int8) & ~127::bigint
           = events.lock_base(partition_owners.app_id))
  SELECT p, (SELECT h.pid FROM held h WHERE h.slot = p LIMIT 1),
         (SELECT count(*)::int FROM held h WHERE h.slot = 64)
    FROM generate_series(0, 63) p
$$;

-- The horizon of an owner's read (docs/ARCHITECTURE.md "The cursor"), in one statement of its
-- own before the read's snapshot, in this order:
--   handed_out:   the last position handed out so far;
--   xid_bound:    a transaction id above every transaction holding one of those positions
--                 (writers take their id before their position; this assigns the reader's own);
--   writers_xmin: the oldest transaction still writing to events.outbox. Writing locks the table
--                 in RowExclusiveLock before it takes a position and keeps the lock to its end, so
--                 a transaction that holds a position and has not ended is among these. A long
--                 transaction that never touches the outbox (a batch job, a migration, a slow
--                 authorize) holds nobody's cursor back, unlike the snapshot's xmin.
-- pg_locks gives 32-bit ids; each is widened to 64 bits against xid_bound (ids within 2^31 of it).
CREATE FUNCTION events.read_horizon(OUT handed_out bigint, OUT xid_bound bigint,
                                    OUT writers_xmin bigint)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  handed_out := coalesce(pg_sequence_last_value(
                  pg_get_serial_sequence('events.outbox', 'position')::regclass), 0);
  xid_bound := pg_current_xact_id()::text::bigint;
  SELECT min(xid_bound + ((x.transactionid::text::bigint - (xid_bound & 4294967295)
                           + 6442450944) % 4294967296 - 2147483648))
    INTO writers_xmin
    FROM pg_locks w
    JOIN pg_locks x ON x.virtualtransaction = w.virtualtransaction
                   AND x.locktype = 'transactionid' AND x.mode = 'ExclusiveLock'
   WHERE w.locktype = 'relation' AND w.mode = 'RowExclusiveLock' AND w.granted
     AND w.relation = 'events.outbox'::regclass
     AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database());
  -- Nobody writing: every transaction below xid_bound that held a position has ended.
  writers_xmin := coalesce(writers_xmin, xid_bound + 1);
END;
$$;

-- The owner's read of its partitions in one round trip: the horizon first, then, in a statement of
-- its own and so under a snapshot taken after it (a VOLATILE function takes one per statement in
-- READ COMMITTED), the app's rows in position order after `after`, at most `max_rows`, without
-- the keys in `skip_keys` and the positions in `known`. Each row carries the horizon; with no row
-- pending, one row of nulls carries it.
CREATE FUNCTION events.read_partitions(app_id text, after bigint, parts smallint[],
                                       skip_keys text[], known bigint[], max_rows integer)
RETURNS TABLE (r_position bigint, r_id text, r_key text, r_envelope text, r_created_us bigint,
               r_attempts integer, r_backoff_ms bigint, r_partition smallint,
               handed_out bigint, xid_bound bigint, writers_xmin bigint)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  h record;
BEGIN
  SELECT * INTO h FROM events.read_horizon();
  RETURN QUERY
    SELECT o.position, o.id::text, o.key, o.envelope::text,
           (extract(epoch FROM o.created_at) * 1000000)::bigint, o.attempts,
           CASE WHEN o.retry_at > now()
                THEN ceil(extract(epoch FROM o.retry_at - now()) * 1000)::bigint ELSE 0 END,
           o.partition, h.handed_out, h.xid_bound, h.writers_xmin
      FROM events.outbox o
     WHERE o.app_id = read_partitions.app_id AND o.position > read_partitions.after
       AND o.topic = 'live' AND o.partition = ANY(read_partitions.parts)
       AND o.key <> ALL(read_partitions.skip_keys) AND o.position <> ALL(read_partitions.known)
     ORDER BY o.position
     LIMIT read_partitions.max_rows;
  IF NOT FOUND THEN
    RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::bigint,
                        NULL::integer, NULL::bigint, NULL::smallint,
                        h.handed_out, h.xid_bound, h.writers_xmin;
  END IF;
END;
$$;

-- Writers take their transaction id before the position: a position is then never older than
-- the transaction that holds it, which is what lets the owner's cursor pass a position only once
-- every transaction that may still commit a row below it has ended. Otherwise unchanged from 001.
CREATE OR REPLACE FUNCTION events.enqueue(id uuid, app_id text, topic text, key text, envelope jsonb,
                                          coalesce_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
  stored   jsonb := envelope;
  written  bigint;
BEGIN
  IF app_id IS NULL OR app_id !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'events.enqueue: app id % must match [a-z0-9][a-z0-9-]{0,62}', quote_nullable(app_id)
      USING ERRCODE = '22023';
  END IF;
  IF topic IS NULL OR topic !~ '^[a-z][a-z0-9_-]{0,62}$' THEN
    RAISE EXCEPTION 'events.enqueue: topic % must match [a-z][a-z0-9_-]{0,62}', quote_nullable(topic)
      USING ERRCODE = '22023';
  END IF;
  IF id IS NULL THEN
    RAISE EXCEPTION 'events.enqueue: id must not be null' USING ERRCODE = '22004';
  END IF;
  IF key IS NULL OR length(key) < 1 OR length(key) > 600 THEN
    RAISE EXCEPTION 'events.enqueue: key must have 1 to 600 characters (got %)', coalesce(length(key), 0)
      USING ERRCODE = '22023';
  END IF;
  IF coalesce_key IS NOT NULL AND length(coalesce_key) > 600 THEN
    RAISE EXCEPTION 'events.enqueue: coalesce key must have at most 600 characters (got %)', length(coalesce_key)
      USING ERRCODE = '22023';
  END IF;
  IF envelope IS NULL OR jsonb_typeof(envelope) <> 'object'
     OR (envelope -> 'v') IS DISTINCT FROM '1'::jsonb THEN
    RAISE EXCEPTION 'events.enqueue: envelope must be an object with "v": 1' USING ERRCODE = '22023';
  END IF;
  IF (envelope ->> 'k') IS DISTINCT FROM key THEN
    RAISE EXCEPTION 'events.enqueue: envelope "k" must equal the key' USING ERRCODE = '22023';
  END IF;
  -- Oversized data never fails the write: subscribers of the key reload instead (SPEC 2.1).
  IF envelope ? 'd' AND octet_length((envelope -> 'd')::text) > 32768 THEN
    stored := jsonb_build_object('v', 1, 'k', key, 'resync', 'oversized');
  END IF;

  PERFORM pg_current_xact_id();
  INSERT INTO events.outbox AS o (id, app_id, topic, key, envelope, coalesce_key)
  VALUES (enqueue.id, enqueue.app_id, enqueue.topic, enqueue.key, stored, enqueue.coalesce_key)
  ON CONFLICT (app_id, topic, coalesce_key, tx_id) WHERE coalesce_key IS NOT NULL
  DO UPDATE SET key = EXCLUDED.key, envelope = EXCLUDED.envelope
  RETURNING o.position INTO written;
  RETURN written;
END;
$$;

-- The lease claim is gone: a replica of an earlier version still running would publish without
-- regard to partition owners, so it now fails loudly (and publishes nothing) until upgraded.
DROP FUNCTION events.claim(text, text[], integer, interval);
