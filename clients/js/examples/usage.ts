// A typed use of @outlive/client; clients/js/test.sh compiles it with tsc --noEmit, so the
// declarations and this example cannot drift apart. The @ts-expect-error lines are mistakes the
// types must catch.
import {
  CloseCode,
  LiveClient,
  checkFilter,
  reconnectDelay,
  type ConnectionState,
  type Filter,
  type StateInfo,
  type Subscription,
} from "@outlive/client";

interface ItemEvent {
  type: "item.created" | "item.updated" | "item.deleted";
  itemId: string;
  qty?: number;
}

const isItemEvent = (data: unknown): data is ItemEvent =>
  typeof data === "object" && data !== null && typeof (data as { itemId?: unknown }).itemId === "string";

const client = new LiveClient({ url: "/api/inventory/live", base: 250, connectTimeout: 0 });

client.onState((state: ConnectionState, info: Readonly<StateInfo>) => {
  if (state === "stopped" && info.code === CloseCode.NOT_SERVED) console.warn("signed out?", info.error);
  if (state === "reconnecting" && info.invalidScope) console.warn(`subscription ${info.invalidScope} had an invalid scope`);
});
const removeErrors = client.onError(({ code, message }) => console.warn(code, message));

const deletions: Filter = { type: "item.deleted" };
const sub: Subscription<ItemEvent> = client.subscribe<ItemEvent>({
  channel: "warehouse",
  scope: { warehouse: "north" },
  filter: deletions,
  cursor: null,
  validate: isItemEvent,
  onSubscribed({ cursor, resumed }) {
    if (!resumed) console.log("load the state after", cursor);
  },
  onUpdate(data, { key, cursor }) {
    const id: string = data.itemId; // typed by the subscribe<T>
    console.log(key, cursor, id, data.type);
  },
  onResync({ reason, cursor }) {
    console.log("reload", reason, cursor);
  },
  onRevoked({ reason }) {
    console.log("no access", reason);
  },
  onError({ code, message, ended }) {
    if (ended && code === "invalid_scope") console.error(message);
  },
});

const cursor: string | null = sub.cursor;
const filter: Filter | null = sub.filter;
console.log(cursor, filter, sub.id, sub.active, checkFilter({ a: 1 }), reconnectDelay(3, { random: () => 0.5 }));

// @ts-expect-error a filter compares scalars only
client.subscribe({ channel: "warehouse", filter: { where: { nested: true } } });
// @ts-expect-error channel is required
client.subscribe({ scope: {} });
// @ts-expect-error onUpdate receives the subscription's type
client.subscribe<ItemEvent>({ channel: "warehouse", onUpdate: (data: { other: number }) => data });

// SPEC 5.1 rev 4: a JWT from an identity provider, sent as the first message of every socket
declare const idp: { getToken(): Promise<string> };
const withJwt = new LiveClient({ app: "inventory", token: () => idp.getToken() });
const withSyncToken = new LiveClient({ app: "inventory", token: () => "header.payload.signature" });
withJwt.onError(({ code }) => {
  if (code === "token" || code === "token_expired") console.warn("refreshing the session");
});
withJwt.onState((state, info) => {
  if (state === "reconnecting" && info.code === CloseCode.TOKEN_EXPIRED) console.log("token expired: reconnecting at once");
});
// @ts-expect-error the token is a function, never a fixed string (it would go stale)
new LiveClient({ app: "inventory", token: "header.payload.signature" });
// @ts-expect-error token() gives a string
new LiveClient({ app: "inventory", token: async () => 42 });
withJwt.close();
withSyncToken.close();

sub.unsubscribe();
removeErrors();
client.close();

// SPEC 5.9: Server-Sent Events where websockets are blocked ("auto" is the default).
const viaSse = new LiveClient({ app: "inventory", transport: "sse" });
const chosen: "websocket" | "sse" = viaSse.transport;
void chosen;
