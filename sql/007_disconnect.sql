-- Ending a viewer's sockets in the transaction that signs them out (SPEC 2.6 rev 4,
-- docs/ARCHITECTURE.md "Disconnects"). A disconnect travels through the outbox like an update, so
-- it is ordered with the app's updates and a rollback ends nothing. Updates are ordered per
-- partition (003), and an update written after the disconnect may be in any of the 64: so the
-- disconnect is written once into each partition, under a key that falls into it, and a replica
-- acts on the first of the 64 it reads (they share one id). Every update of the transaction after
-- the call follows one of them in its partition, so in the topic.

-- A key per partition (found once: the first `outlive:disconnect:<n>` that falls into it).
CREATE TABLE events.partition_keys (
  partition smallint PRIMARY KEY,
  key       text NOT NULL
);
INSERT INTO events.partition_keys (partition, key)
SELECT DISTINCT ON (events.partition_of('outlive:disconnect:' || n))
       events.partition_of('outlive:disconnect:' || n), 'outlive:disconnect:' || n
  FROM generate_series(0, 9999) AS n
 ORDER BY events.partition_of('outlive:disconnect:' || n), n;
DO $$
BEGIN
  IF (SELECT count(*) FROM events.partition_keys) <> 64 THEN
    RAISE EXCEPTION 'events.partition_keys: a partition has no key';
  END IF;
END;
$$;

-- The disconnects of the last 30 days (auth.jwt.max_lifetime_s is at most that): a replica that
-- starts later refuses the JWTs issued before them (SPEC 2.6).
CREATE TABLE events.disconnects (
  id      uuid PRIMARY KEY,
  app_id  text NOT NULL,
  viewer  text NOT NULL,
  reason  text NOT NULL,
  disconnected_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX disconnects_app_at_idx ON events.disconnects (app_id, disconnected_at);
REVOKE ALL ON TABLE events.partition_keys, events.disconnects FROM PUBLIC;

CREATE FUNCTION events.disconnect(app_id text, viewer text, reason text DEFAULT 'signed_out')
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
  id        uuid := gen_random_uuid();
  now_at    timestamptz := clock_timestamp();
  body      jsonb;
BEGIN
  IF app_id IS NULL OR app_id !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'events.disconnect: app id % must match [a-z0-9][a-z0-9-]{0,62}', quote_nullable(app_id)
      USING ERRCODE = '22023';
  END IF;
  PERFORM events.require_writer('events.disconnect', app_id);
  IF viewer IS NULL OR length(viewer) < 1 OR length(viewer) > 600 THEN
    RAISE EXCEPTION 'events.disconnect: viewer must have 1 to 600 characters (got %)', coalesce(length(viewer), 0)
      USING ERRCODE = '22023';
  END IF;
  IF reason IS NULL OR length(reason) < 1 OR length(reason) > 200 THEN
    RAISE EXCEPTION 'events.disconnect: reason must have 1 to 200 characters (got %)', coalesce(length(reason), 0)
      USING ERRCODE = '22023';
  END IF;

  DELETE FROM events.disconnects d
   WHERE d.app_id = disconnect.app_id AND d.disconnected_at < now_at - interval '30 days';
  INSERT INTO events.disconnects (id, app_id, viewer, reason, disconnected_at)
  VALUES (id, app_id, viewer, reason, now_at);
  body := jsonb_build_object('id', id, 'viewer', viewer, 'reason', reason,
                             'at_ms', floor(extract(epoch FROM now_at) * 1000)::bigint);
  PERFORM events.write_update(gen_random_uuid(), app_id, 'live', p.key,
                              jsonb_build_object('v', 1, 'k', p.key, 'disconnect', body), NULL)
     FROM events.partition_keys p
    ORDER BY p.partition;
END;
$$;
REVOKE EXECUTE ON FUNCTION events.disconnect(text, text, text) FROM PUBLIC;

-- The writers granted before this migration may disconnect their apps' viewers too.
DO $$
DECLARE
  r regrole;
BEGIN
  FOR r IN SELECT DISTINCT w.role FROM events.writers w LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION events.disconnect(text, text, text) TO %s', r);
  END LOOP;
END;
$$;

-- As in 005, with events.disconnect among the functions a grant gives.
CREATE OR REPLACE FUNCTION events.grant_writer(role name, app_id text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
  grantee  oid;
  owner    oid := (SELECT c.relowner FROM pg_class c WHERE c.oid = 'events.outbox'::regclass);
BEGIN
  IF app_id IS NULL OR app_id !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'events.grant_writer: app id % must match [a-z0-9][a-z0-9-]{0,62}', quote_nullable(app_id)
      USING ERRCODE = '22023';
  END IF;
  SELECT r.oid INTO grantee FROM pg_roles r WHERE r.rolname = role;
  IF grantee IS NULL THEN
    RAISE EXCEPTION 'events.grant_writer: role % does not exist', quote_nullable(role)
      USING ERRCODE = '42704';
  END IF;
  -- The owner's own rights on the table would go with the REVOKE below.
  IF pg_has_role(grantee, owner, 'MEMBER') OR pg_has_role(grantee, current_user, 'MEMBER') THEN
    RAISE EXCEPTION 'events.grant_writer: role % owns events.outbox (or is a superuser or a member of its owner) and writes every app already',
      quote_ident(role)
      USING ERRCODE = '22023';
  END IF;

  INSERT INTO events.writers AS w (app_id, role) VALUES (app_id, grantee::regrole)
  ON CONFLICT ON CONSTRAINT writers_pkey DO NOTHING;
  EXECUTE format('GRANT USAGE ON SCHEMA events TO %I', role);
  EXECUTE format('GRANT EXECUTE ON FUNCTION events.enqueue(uuid, text, text, text, jsonb, text),'
                 ' events.publish_live(text, text, jsonb, boolean, text), events.wake(text),'
                 ' events.disconnect(text, text, text) TO %I',
                 role);
  EXECUTE format('REVOKE ALL ON TABLE events.outbox, events.writers, events.disconnects FROM %I', role);
  EXECUTE format('REVOKE ALL ON SEQUENCE events.outbox_position_seq FROM %I', role);
  -- Rights through PUBLIC or another role's membership are not this grant's to take back.
  IF has_table_privilege(grantee, 'events.outbox', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE') THEN
    RAISE WARNING 'events.grant_writer: role % still has direct rights on events.outbox through another role: it is not isolated',
      quote_ident(role);
  END IF;
END;
$$;

CREATE OR REPLACE FUNCTION events.revoke_writer(role name, app_id text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
  grantee  oid;
  removed  boolean;
BEGIN
  SELECT r.oid INTO grantee FROM pg_roles r WHERE r.rolname = role;
  IF grantee IS NULL THEN
    RAISE EXCEPTION 'events.revoke_writer: role % does not exist', quote_nullable(role)
      USING ERRCODE = '42704';
  END IF;
  DELETE FROM events.writers w WHERE w.role = grantee::regrole AND w.app_id = app_id;
  removed := FOUND;
  IF NOT EXISTS (SELECT 1 FROM events.writers w WHERE w.role = grantee::regrole) THEN
    EXECUTE format('REVOKE EXECUTE ON FUNCTION events.enqueue(uuid, text, text, text, jsonb, text),'
                   ' events.publish_live(text, text, jsonb, boolean, text), events.wake(text),'
                   ' events.disconnect(text, text, text) FROM %I',
                   role);
  END IF;
  RETURN removed;
END;
$$;
