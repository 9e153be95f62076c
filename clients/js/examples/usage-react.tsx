// A typed use of useLive from @outlive/client/react; compiled by clients/js/test.sh (tsc --noEmit).
import { useMemo, useRef, useState } from "react";
import { LiveClient } from "@outlive/client";
import { useLive, type LiveStatus, type LoadInfo } from "@outlive/client/react";

interface Item {
  itemId: string;
  type: "item.created" | "item.updated" | "item.deleted";
  qty?: number;
}

async function fetchItems(warehouse: string, { cursor, signal }: LoadInfo): Promise<Item[]> {
  const response = await fetch(`/api/inventory/warehouses/${warehouse}/items?after=${cursor}`, { signal });
  return (await response.json()) as Item[];
}

export function Warehouse({ client, warehouse }: { client: LiveClient; warehouse: string }) {
  const [items, setItems] = useState<Item[]>([]);
  const live = useLive<Item>(client, {
    channel: "warehouse",
    scope: { warehouse },
    load: async (info) => setItems(await fetchItems(warehouse, info)),
    onUpdate: (item) => setItems((all) => [...all.filter((i) => i.itemId !== item.itemId), item]),
  });
  const status: LiveStatus = live.status;
  if (status === "revoked") return <p>You no longer have access to {warehouse}.</p>;
  if (status === "error") return <p>Live updates stopped: {live.error?.code}</p>;
  return (
    <section data-status={status} data-cursor={live.cursor ?? ""}>
      <ul>{items.map((i) => <li key={i.itemId}>{i.itemId}: {i.qty ?? 0}</li>)}</ul>
      {live.lastUpdate && <small>last change: {live.lastUpdate.data.itemId}</small>}
    </section>
  );
}

export function Deletions({ warehouse }: { warehouse: string }) {
  const client = useMemo(() => new LiveClient({ app: "inventory" }), []);
  const { status, lastUpdate, resynced } = useLive<Item>(client, {
    channel: "warehouse",
    scope: { warehouse },
    filter: { type: "item.deleted" },
  });
  return (
    <p data-status={status} onClick={resynced}>
      {lastUpdate ? `deleted ${lastUpdate.data.itemId}` : "no deletions yet"}
    </p>
  );
}

// A signed-in view: the client asks the identity provider for a JWT on every socket and refresh.
// The latest getToken is read through a ref, so a new function identity does not make a new client.
export function SignedInWarehouse({ getToken, warehouse }: { getToken: () => Promise<string>; warehouse: string }) {
  const tokenSource = useRef(getToken);
  tokenSource.current = getToken;
  const client = useMemo(() => new LiveClient({ app: "inventory", token: () => tokenSource.current() }), []);
  return <Warehouse client={client} warehouse={warehouse} />;
}

// @ts-expect-error a filter compares scalars only
export const bad = () => useLive(null, { channel: "warehouse", filter: { qty: [1, 2] } });
