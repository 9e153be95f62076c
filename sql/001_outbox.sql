-- The shared transactional outbox of every application (SPEC 2.1). Holds pending updates only:
-- a replica deletes an update once JetStream acknowledged it.
CREATE TABLE events.outbox (
  position      bigserial PRIMARY KEY,            -- order of writing
  id            uuid NOT NULL UNIQUE,             -- Nats-Msg-Id, so a re-publish is stored once
  app_id        text NOT NULL,
  topic         text NOT NULL,
  key           text NOT NULL,
  envelope      jsonb NOT NULL,
  coalesce_key  text,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  tx_id         xid8 NOT NULL DEFAULT pg_current_xact_id(),
  -- publishing state: a claim is a lease; a failed publish backs its key off until retry_at
  claimed_by    text,
  claimed_until timestamptz,
  attempts      integer NOT NULL DEFAULT 0,
  retry_at      timestamptz,
  last_error    text
);

CREATE INDEX outbox_app_key_idx ON events.outbox (app_id, key, position);
CREATE INDEX outbox_claimed_idx ON events.outbox (claimed_until) WHERE claimed_until IS NOT NULL;
CREATE INDEX outbox_retry_idx ON events.outbox (retry_at) WHERE retry_at IS NOT NULL;
-- coalescing joins the updates of one transaction only: tx_id is part of the key
CREATE UNIQUE INDEX outbox_coalesce_idx ON events.outbox (app_id, topic, coalesce_key, tx_id)
  WHERE coalesce_key IS NOT NULL;

COMMENT ON TABLE events.outbox IS
  'Pending live updates of every application; outlive replicas publish them to JetStream and delete them.';

-- Writes one update in the caller's transaction. Every rule of SPEC 2.1 is enforced here, so it
-- holds for every writer (C++ API, SQL, triggers).
CREATE FUNCTION events.enqueue(id uuid, app_id text, topic text, key text, envelope jsonb,
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

  INSERT INTO events.outbox AS o (id, app_id, topic, key, envelope, coalesce_key)
  VALUES (enqueue.id, enqueue.app_id, enqueue.topic, enqueue.key, stored, enqueue.coalesce_key)
  ON CONFLICT (app_id, topic, coalesce_key, tx_id) WHERE coalesce_key IS NOT NULL
  DO UPDATE SET key = EXCLUDED.key, envelope = EXCLUDED.envelope
  RETURNING o.position INTO written;
  RETURN written;
END;
$$;

-- Builds the id and envelope; with access => true writes the access update first, as a row of its
-- own, so an oversized data value (which becomes a resync) cannot lose it (SPEC 2.3).
CREATE FUNCTION events.publish_live(app_id text, key text, data jsonb, access boolean DEFAULT false,
                                    coalesce_key text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
#variable_conflict use_variable
BEGIN
  IF NOT coalesce(access, false) AND data IS NULL THEN
    RAISE EXCEPTION 'events.publish_live: nothing to publish (data is null and access is false)'
      USING ERRCODE = '22004';
  END IF;
  IF coalesce(access, false) THEN
    PERFORM events.enqueue(gen_random_uuid(), app_id, 'live', key,
                           jsonb_build_object('v', 1, 'k', key, 'access', true), NULL);
  END IF;
  IF data IS NOT NULL THEN
    PERFORM events.enqueue(gen_random_uuid(), app_id, 'live', key,
                           jsonb_build_object('v', 1, 'k', key, 'd', data), coalesce_key);
  END IF;
END;
$$;

-- Asks the replicas to publish now; call after commit (NOTIFY is delivered at commit anyway).
CREATE FUNCTION events.wake(app_id text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  IF app_id IS NULL OR app_id !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'events.wake: app id % must match [a-z0-9][a-z0-9-]{0,62}', quote_nullable(app_id)
      USING ERRCODE = '22023';
  END IF;
  PERFORM pg_notify('outlive_wake', app_id);
END;
$$;

-- Claims up to max_rows pending updates of the given apps for one replica, as a lease (SPEC 3).
-- Claims are serialised between replicas by an advisory lock; a key is skipped while any of its
-- updates is claimed under a live lease or backing off, so per-key order holds across replicas.
CREATE FUNCTION events.claim(replica text, apps text[], max_rows integer, lease interval)
RETURNS TABLE ("position" bigint, id uuid, app_id text, key text, envelope text,
               created_at timestamptz, attempts integer)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
  PERFORM pg_advisory_xact_lock(7301, 1);
  RETURN QUERY
  WITH blocked AS (
    SELECT b.app_id, b.key FROM events.outbox b
     WHERE b.claimed_until > now() AND b.app_id = ANY(claim.apps)
    UNION
    SELECT b.app_id, b.key FROM events.outbox b
     WHERE b.retry_at > now() AND b.app_id = ANY(claim.apps)
  ), picked AS (
    SELECT o.position FROM events.outbox o
     WHERE o.app_id = ANY(claim.apps) AND o.topic = 'live'
       AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.app_id = o.app_id AND b.key = o.key)
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
