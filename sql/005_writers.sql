-- Apps are isolated in the shared outbox (SPEC 2.5, docs/WRITERS.md). A role granted an app with
-- events.grant_writer writes that app's updates through events.enqueue, events.publish_live and
-- events.wake, and nothing else: those three run as the owner (SECURITY DEFINER) after checking the
-- caller against events.writers, and the writer gets no right on the table itself.
--
-- Who the caller is: inside a SECURITY DEFINER function current_user is the function's owner, so
-- the check uses session_user, the role the session logged in as (SET ROLE does not change it,
-- SET SESSION AUTHORIZATION needs a superuser). It passes when session_user is a member of a role
-- granted the app (so a grant to a group role covers its members) or of the owner of the functions
-- (current_user inside them: the role that ran the migrations, which owns events.outbox too and
-- usually runs the replicas; superusers are members of every role), who could write the table
-- directly anyway.

-- The grants. regrole keeps a grant with its role through ALTER ROLE ... RENAME, and a role
-- dropped and created again under the same name does not inherit it.
CREATE TABLE events.writers (
  app_id     text NOT NULL CHECK (app_id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
  role       regrole NOT NULL,
  granted_at timestamptz NOT NULL DEFAULT now(),
  granted_by name NOT NULL DEFAULT session_user,
  PRIMARY KEY (app_id, role)
);
COMMENT ON TABLE events.writers IS
  'Roles allowed to write an app''s live updates (events.grant_writer / events.revoke_writer).';

-- Nobody but the owner touches the outbox or the grants directly; earlier setups granted writers
-- table rights (INSERT, SELECT for ON CONFLICT, USAGE on the sequence): grant_writer takes them back.
REVOKE ALL ON TABLE events.outbox, events.writers, events.schema_migrations FROM PUBLIC;
REVOKE ALL ON SEQUENCE events.outbox_position_seq FROM PUBLIC;

-- Raises 42501 naming the session's role and the app unless the session may write `app_id`. Called
-- only from the SECURITY DEFINER functions below (PUBLIC has no EXECUTE), so current_user is their
-- owner and search_path is already pinned: no SET of its own, which would cost a third of the check.
CREATE FUNCTION events.require_writer(caller text, app_id text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  IF pg_catalog.pg_has_role(session_user, current_user, 'MEMBER') THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM events.writers w
              WHERE w.app_id = require_writer.app_id
                AND pg_catalog.pg_has_role(session_user, w.role::pg_catalog.oid, 'MEMBER')) THEN
    RETURN;
  END IF;
  RAISE EXCEPTION '%: role % may not write the live updates of app %', caller,
    pg_catalog.quote_ident(session_user), pg_catalog.quote_literal(app_id)
    USING ERRCODE = '42501',
          HINT = 'The owner of events.outbox grants it: SELECT events.grant_writer(''role'', ''app'').';
END;
$$;

-- The rules of SPEC 2.1 and the write itself, unchecked: called by the checked functions below
-- (so one check per publish_live, however many rows), never by PUBLIC. As events.enqueue in 003,
-- plus the 256 KiB limit on the envelope the row carries (after an oversized `d` became a resync,
-- which never fails).
CREATE FUNCTION events.write_update(id uuid, app_id text, topic text, key text, envelope jsonb,
                                    coalesce_key text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
  stored   jsonb := envelope;
  written  bigint;
  size     integer;
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
  -- The replicas publish envelope::text as it is: a row larger than the topic accepts would stall
  -- its key forever, so it is refused here, in the writer's transaction.
  size := octet_length(stored::text);
  IF size > 262144 THEN
    RAISE EXCEPTION 'events.enqueue: envelope of app % key % is % bytes, more than the 262144 (256 KiB) a live update may have',
      quote_literal(app_id), quote_literal(left(key, 60)), size
      USING ERRCODE = '22023';
  END IF;

  -- Writers take their transaction id before the position (003).
  PERFORM pg_current_xact_id();
  INSERT INTO events.outbox AS o (id, app_id, topic, key, envelope, coalesce_key)
  VALUES (write_update.id, write_update.app_id, write_update.topic, write_update.key, stored,
          write_update.coalesce_key)
  ON CONFLICT (app_id, topic, coalesce_key, tx_id) WHERE coalesce_key IS NOT NULL
  DO UPDATE SET key = EXCLUDED.key, envelope = EXCLUDED.envelope
  RETURNING o.position INTO written;
  RETURN written;
END;
$$;

-- SPEC 2.1 and 2.5: checked, then written as the owner.
CREATE OR REPLACE FUNCTION events.enqueue(id uuid, app_id text, topic text, key text, envelope jsonb,
                                          coalesce_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF app_id IS NULL OR app_id !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'events.enqueue: app id % must match [a-z0-9][a-z0-9-]{0,62}', quote_nullable(app_id)
      USING ERRCODE = '22023';
  END IF;
  PERFORM events.require_writer('events.enqueue', app_id);
  RETURN events.write_update(id, app_id, topic, key, envelope, coalesce_key);
END;
$$;

-- As in 001, checked once before anything is built.
CREATE OR REPLACE FUNCTION events.publish_live(app_id text, key text, data jsonb, access boolean DEFAULT false,
                                               coalesce_key text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
  IF app_id IS NULL OR app_id !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'events.publish_live: app id % must match [a-z0-9][a-z0-9-]{0,62}', quote_nullable(app_id)
      USING ERRCODE = '22023';
  END IF;
  PERFORM events.require_writer('events.publish_live', app_id);
  IF NOT coalesce(access, false) AND data IS NULL THEN
    RAISE EXCEPTION 'events.publish_live: nothing to publish (data is null and access is false)'
      USING ERRCODE = '22004';
  END IF;
  IF coalesce(access, false) THEN
    PERFORM events.write_update(gen_random_uuid(), app_id, 'live', key,
                                jsonb_build_object('v', 1, 'k', key, 'access', true), NULL);
  END IF;
  IF data IS NOT NULL THEN
    PERFORM events.write_update(gen_random_uuid(), app_id, 'live', key,
                                jsonb_build_object('v', 1, 'k', key, 'd', data), coalesce_key);
  END IF;
END;
$$;

-- A wake for another app would make its replicas read for nothing: checked like a write.
CREATE OR REPLACE FUNCTION events.wake(app_id text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF app_id IS NULL OR app_id !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'events.wake: app id % must match [a-z0-9][a-z0-9-]{0,62}', quote_nullable(app_id)
      USING ERRCODE = '22023';
  END IF;
  PERFORM events.require_writer('events.wake', app_id);
  PERFORM pg_notify('outlive_wake', app_id);
END;
$$;

-- Lets `role` write the live updates of `app_id`: records the grant, gives the role what calling the
-- three write functions needs, and takes back any direct right on the outbox it had. Callable by
-- the owner of events.outbox and superusers (and roles they grant EXECUTE on it to).
CREATE FUNCTION events.grant_writer(role name, app_id text)
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
                 ' events.publish_live(text, text, jsonb, boolean, text), events.wake(text) TO %I',
                 role);
  EXECUTE format('REVOKE ALL ON TABLE events.outbox, events.writers FROM %I', role);
  EXECUTE format('REVOKE ALL ON SEQUENCE events.outbox_position_seq FROM %I', role);
  -- Rights through PUBLIC or another role's membership are not this grant's to take back.
  IF has_table_privilege(grantee, 'events.outbox', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE') THEN
    RAISE WARNING 'events.grant_writer: role % still has direct rights on events.outbox through another role: it is not isolated',
      quote_ident(role);
  END IF;
END;
$$;

-- Takes `app_id` away from `role`; true when it had been granted. A role left without any app loses
-- EXECUTE on the write functions too.
CREATE FUNCTION events.revoke_writer(role name, app_id text)
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
                   ' events.publish_live(text, text, jsonb, boolean, text), events.wake(text) FROM %I',
                   role);
  END IF;
  RETURN removed;
END;
$$;

REVOKE EXECUTE ON FUNCTION events.enqueue(uuid, text, text, text, jsonb, text),
  events.publish_live(text, text, jsonb, boolean, text), events.wake(text),
  events.require_writer(text, text),
  events.write_update(uuid, text, text, text, jsonb, text), events.grant_writer(name, text),
  events.revoke_writer(name, text)
  FROM PUBLIC;
