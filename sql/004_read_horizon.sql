-- The horizon without a transaction id of the reader's own (issue 15). 003 took one
-- (pg_current_xact_id) as the bound above every writer's id, which spent an id on every read: at 500
-- wakes a second that is 500 ids a second, and every table's anti-wraparound vacuum comes that much
-- sooner. The bound is now the newest id among the outbox writers the read sees after it took the
-- positions handed out: a writer still holding one of those positions is among them, since it took
-- its id (events.enqueue), then locked the table (its INSERT), then its position, and holds both to
-- its end. With no writer in sight every position handed out so far is final at once.
CREATE OR REPLACE FUNCTION events.read_horizon(OUT handed_out bigint, OUT xid_bound bigint,
                                               OUT writers_xmin bigint)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  near bigint;
BEGIN
  handed_out := coalesce(pg_sequence_last_value(
                  pg_get_serial_sequence('events.outbox', 'position')::regclass), 0);
  -- A 64-bit id within 2^31 of every running transaction's (it assigns none), to widen the 32-bit
  -- ids of pg_locks against; every id that ended before it is below it.
  near := pg_snapshot_xmax(pg_current_snapshot())::text::bigint;
  SELECT min(writer), max(writer) INTO writers_xmin, xid_bound
    FROM (SELECT near + ((x.transactionid::text::bigint - (near & 4294967295) + 6442450944)
                         % 4294967296 - 2147483648) AS writer
            FROM pg_locks w
            JOIN pg_locks x ON x.virtualtransaction = w.virtualtransaction
                           AND x.locktype = 'transactionid' AND x.mode = 'ExclusiveLock'
           WHERE w.locktype = 'relation' AND w.mode = 'RowExclusiveLock' AND w.granted
             AND w.relation = 'events.outbox'::regclass
             AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
         writers;
  -- Nobody writing: the bound is passed at once (and by every later read, whose `near` is no lower).
  xid_bound := coalesce(xid_bound, near - 1);
  writers_xmin := coalesce(writers_xmin, near);
END;
$$;
