-- Ownership that needs progress (issue 33; docs/ARCHITECTURE.md "Leases"). 003's session advisory
-- locks ended only with the owner's connection, which a frozen process (SIGSTOP, a VM paused, a
-- debugger) or a silent network partition keeps up: its keys stalled for as long as it was frozen.
-- Now each publisher holds one lease row for all its apps and renews it every 500 ms from its
-- loop; a lease that is not renewed for 3 s (Postgres's clock) is dead, and so is one whose
-- backend is gone (a SIGKILLed replica is taken over at the next round, not after the lease).
-- Partitions are assigned from the live, able leases alone (events.partition_owners), so nothing
-- per app or per partition is written or locked: an idle replica costs one UPDATE per round.

CREATE TABLE events.publisher_leases (
  member      text PRIMARY KEY,    -- one publisher run: the replica's name and a random suffix
  replica     text NOT NULL,
  apps        text[] NOT NULL,
  backend_pid integer NOT NULL,    -- the member's connection (a dead one ends the lease at once)
  -- The fencing token: a new value from the sequence each time the member takes a lease it did
  -- not hold (its first, or after it expired); reads under an older one return nothing.
  epoch       bigint NOT NULL,
  able        boolean NOT NULL,    -- false: cut off from NATS, it wants no partitions
  expires_at  timestamptz NOT NULL,
  renewed_at  timestamptz NOT NULL
);

CREATE SEQUENCE events.publisher_epoch;

-- Whether a lease counts: renewed in time, and its backend still connected.
CREATE FUNCTION events.lease_live(expires_at timestamptz, backend_pid integer)
RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT expires_at > now() AND EXISTS (SELECT 1 FROM pg_stat_get_activity(backend_pid)) $$;

-- One round of a member: renews its lease if it still holds it under `held_epoch`, or takes a new
-- one under a new epoch (held_epoch 0: joining). Returns the member's epoch after the round, then
-- every live lease (the member's own included), which the member assigns partitions from exactly
-- as events.partition_owners does.
CREATE FUNCTION events.lease_round(member text, replica text, apps text[], ttl_ms integer,
                                   held_epoch bigint, able boolean)
RETURNS TABLE (my_epoch bigint, m_member text, m_apps text[], m_able boolean, m_pid integer)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
  e bigint;
BEGIN
  UPDATE events.publisher_leases l
     SET expires_at = now() + make_interval(secs => lease_round.ttl_ms / 1000.0),
         renewed_at = now(), able = lease_round.able, apps = lease_round.apps,
         backend_pid = pg_backend_pid()
   WHERE l.member = lease_round.member AND l.epoch = lease_round.held_epoch
     AND l.expires_at > now()
  RETURNING l.epoch INTO e;
  IF e IS NULL THEN
    e := nextval('events.publisher_epoch');
    INSERT INTO events.publisher_leases AS l
           (member, replica, apps, backend_pid, epoch, able, expires_at, renewed_at)
    VALUES (lease_round.member, lease_round.replica, lease_round.apps, pg_backend_pid(), e,
            lease_round.able, now() + make_interval(secs => lease_round.ttl_ms / 1000.0), now())
    ON CONFLICT (member) DO UPDATE
       SET apps = EXCLUDED.apps, backend_pid = EXCLUDED.backend_pid, epoch = EXCLUDED.epoch,
           able = EXCLUDED.able, expires_at = EXCLUDED.expires_at, renewed_at = EXCLUDED.renewed_at;
    -- Leases dead for a minute are nobody's: the table stays as small as the set of replicas.
    DELETE FROM events.publisher_leases l WHERE l.expires_at < now() - interval '1 minute';
  END IF;
  RETURN QUERY
    SELECT e, l.member, l.apps, l.able, l.backend_pid
      FROM events.publisher_leases l
     WHERE events.lease_live(l.expires_at, l.backend_pid)
     ORDER BY l.member;
END;
$$;

-- A member that stops gives its lease up at once, so the others take its partitions next round.
CREATE FUNCTION events.lease_end(member text, held_epoch bigint)
RETURNS void
LANGUAGE sql VOLATILE
AS $$
  DELETE FROM events.publisher_leases l
   WHERE l.member = lease_end.member AND l.epoch = lease_end.held_epoch
$$;

-- The owners' read (sql/003 events.read_partitions) only under a lease still held: a member whose
-- lease expired (it was frozen, or cut off) reads nothing, not even the horizon row, and takes
-- that as the loss of its partitions.
CREATE FUNCTION events.read_owned(member text, held_epoch bigint, app_id text, after bigint,
                                  parts smallint[], skip_keys text[], known bigint[],
                                  max_rows integer)
RETURNS TABLE (r_position bigint, r_id text, r_key text, r_envelope text, r_created_us bigint,
               r_attempts integer, r_backoff_ms bigint, r_partition smallint,
               handed_out bigint, xid_bound bigint, writers_xmin bigint)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM events.publisher_leases l
                  WHERE l.member = read_owned.member AND l.epoch = read_owned.held_epoch
                    AND l.expires_at > now()) THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT * FROM events.read_partitions(read_owned.app_id, read_owned.after,
                                                    read_owned.parts, read_owned.skip_keys,
                                                    read_owned.known, read_owned.max_rows);
END;
$$;

-- The owners of an app's partitions as the members compute them: the live, able leases serving the
-- app in member order; partition p goes to the (p mod M)-th. Same columns as 003's version (which
-- read advisory locks), so what watches ownership keeps working; owner_pid is the owner's backend.
CREATE OR REPLACE FUNCTION events.partition_owners(app_id text)
RETURNS TABLE (part integer, owner_pid integer, members integer)
LANGUAGE sql STABLE
AS $$
  WITH m AS (
    SELECT l.backend_pid, (row_number() OVER (ORDER BY l.member COLLATE "C") - 1)::int AS i,
           count(*) OVER ()::int AS n
      FROM events.publisher_leases l
     WHERE partition_owners.app_id = ANY(l.apps) AND l.able
       AND events.lease_live(l.expires_at, l.backend_pid))
  SELECT p, (SELECT m.backend_pid FROM m WHERE m.i = p % m.n),
         coalesce((SELECT max(m.n) FROM m), 0)
    FROM generate_series(0, 63) p
$$;
