-- The inventory demo's own tables, the auth tables of SPEC 6.1 and the demo data.
-- Idempotent: outlive_demo_run applies it at every start (after the outlive migrations, which create
-- events.outbox and events.enqueue). Re-applying restores the demo memberships but keeps the
-- quantities and names that were changed.

CREATE SCHEMA IF NOT EXISTS auth;

-- Credentials are stored as the lowercase hex SHA-256 of the token only (SPEC 5.1, 6.1).
CREATE TABLE IF NOT EXISTS auth.sessions (
  token_sha256 text PRIMARY KEY,
  subject      text NOT NULL,              -- user:<id>
  actor        text NOT NULL,
  app_session  boolean NOT NULL DEFAULT false,
  expires_at   timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS auth.api_keys (
  key_sha256 text PRIMARY KEY,
  subject    text NOT NULL,                -- user:<id> or service_account:<id>
  actor      text NOT NULL,
  scopes     text[] NOT NULL DEFAULT '{}',
  revoked_at timestamptz
);

CREATE TABLE IF NOT EXISTS auth.oauth_tokens (
  token_sha256 text PRIMARY KEY,
  subject      text NOT NULL,
  actor        text NOT NULL,
  scopes       text[] NOT NULL DEFAULT '{}',
  expires_at   timestamptz NOT NULL
);

CREATE SCHEMA IF NOT EXISTS inventory;

CREATE TABLE IF NOT EXISTS inventory.warehouses (
  id        uuid PRIMARY KEY,
  public_id text NOT NULL UNIQUE,          -- what URLs and subscription scopes name
  name      text NOT NULL DEFAULT ''
);

CREATE TABLE IF NOT EXISTS inventory.items (
  id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  short_id     text NOT NULL UNIQUE,       -- what the page and the live updates name
  warehouse_id uuid NOT NULL REFERENCES inventory.warehouses(id),
  name         text NOT NULL,
  quantity     int NOT NULL DEFAULT 0 CHECK (quantity >= 0)
);
CREATE INDEX IF NOT EXISTS items_warehouse_idx ON inventory.items (warehouse_id);

-- Who may read a warehouse: the channels' keys() and authorize() queries read this table.
CREATE TABLE IF NOT EXISTS inventory.members (
  warehouse_id uuid NOT NULL REFERENCES inventory.warehouses(id),
  subject      text NOT NULL,              -- the viewer's accessSubject, e.g. user:ada
  PRIMARY KEY (warehouse_id, subject)
);
CREATE INDEX IF NOT EXISTS members_subject_idx ON inventory.members (subject);

-- The trigger path (SPEC 2.1, seed 004 "Write from a database trigger"): renaming an item writes a
-- live update through events.enqueue in the renaming transaction. The coalesce key joins the
-- renames of one item in one transaction into one update. The data names the item only; the page
-- loads it again (the quantity path sends the new quantity itself through the C++ API).
CREATE OR REPLACE FUNCTION inventory.publish_item_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM events.enqueue(
    gen_random_uuid(),
    'inventory',
    'live',
    NEW.warehouse_id::text,
    jsonb_build_object(
      'v', 1,
      'k', NEW.warehouse_id::text,
      'd', jsonb_build_object('type', 'item.changed', 'itemId', NEW.short_id)
    ),
    NEW.warehouse_id::text || ':' || NEW.short_id
  );
  RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER items_publish_name_change
  AFTER UPDATE OF name ON inventory.items
  FOR EACH ROW
  WHEN (OLD.name IS DISTINCT FROM NEW.name)
  EXECUTE FUNCTION inventory.publish_item_change();

-- Demo data: two warehouses with a few items; ada is a member of both.
INSERT INTO inventory.warehouses (id, public_id, name) VALUES
  ('6f1c2a9e-0000-4000-8000-000000000001', 'north', 'North warehouse'),
  ('6f1c2a9e-0000-4000-8000-000000000002', 'south', 'South warehouse')
ON CONFLICT (id) DO NOTHING;

INSERT INTO inventory.items (id, short_id, warehouse_id, name, quantity) VALUES
  ('6f1c2a9e-0000-4000-8000-000000000101', 'n-bolts',   '6f1c2a9e-0000-4000-8000-000000000001', 'Bolts M8',       120),
  ('6f1c2a9e-0000-4000-8000-000000000102', 'n-nuts',    '6f1c2a9e-0000-4000-8000-000000000001', 'Nuts M8',        250),
  ('6f1c2a9e-0000-4000-8000-000000000103', 'n-washers', '6f1c2a9e-0000-4000-8000-000000000001', 'Washers 8 mm',    75),
  ('6f1c2a9e-0000-4000-8000-000000000201', 's-pallets', '6f1c2a9e-0000-4000-8000-000000000002', 'Pallets',         12),
  ('6f1c2a9e-0000-4000-8000-000000000202', 's-crates',  '6f1c2a9e-0000-4000-8000-000000000002', 'Crates',          30),
  ('6f1c2a9e-0000-4000-8000-000000000203', 's-tape',    '6f1c2a9e-0000-4000-8000-000000000002', 'Packing tape',     8)
ON CONFLICT (id) DO NOTHING;

INSERT INTO inventory.members (warehouse_id, subject) VALUES
  ('6f1c2a9e-0000-4000-8000-000000000001', 'user:ada'),
  ('6f1c2a9e-0000-4000-8000-000000000002', 'user:ada')
ON CONFLICT DO NOTHING;

-- The demo API key of ada (read scope), for non-browser clients:
--   Authorization: Bearer outlive-demo-key-ada
-- A session is created at sign-in (POST /api/signin); none is seeded.
INSERT INTO auth.api_keys (key_sha256, subject, actor, scopes) VALUES
  (encode(sha256(convert_to('outlive-demo-key-ada', 'UTF8')), 'hex'), 'user:ada', 'user:ada', ARRAY['read'])
ON CONFLICT (key_sha256) DO NOTHING;

-- Expired sessions are of no use to anyone.
DELETE FROM auth.sessions WHERE expires_at < now() - interval '1 day';
