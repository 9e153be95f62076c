// routes(): the replica's hooks (SPEC 5.1, 5.4) through the Fetch-API handler, signed as the
// replica signs them: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>.
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { createServer } from "node:http";
import { z } from "zod";
import { defineLive, channel, signHookBody, verifySignature } from "../index.js";

const SECRET = "s3cret-from-hook_secret_file";
const live = defineLive({ appId: "inventory", event: z.object({ type: z.string() }) });

const calls = [];
const channels = {
  warehouse: channel({
    scope: z.object({ warehouse: z.string().min(1) }).strict(),
    keys: async ({ warehouse }, viewer) => {
      calls.push(["keys", warehouse, viewer.id]);
      if (warehouse === "boom") throw new Error("database down");
      if (warehouse === "wrong") return [5];
      return warehouse === "missing" ? null : [`wh-${warehouse}`];
    },
    authorize: async (key, viewers) => {
      calls.push(["authorize", key, viewers.length]);
      if (key === "boom") throw new Error("permission service down");
      if (key === "wrong") return { allowed: [] };
      // ada may read everything; bob only wh-north; an id that was not asked is dropped
      return [...viewers.filter((v) => v.accessSubject === "user:ada" || key === "wh-north").map((v) => v.id), "user:mallory"];
    },
  }),
  mine: { collection: true, scope: z.object({}).strict(), keys: () => [], authorize: () => [] },
};

function handler(options = {}) {
  return live.routes(channels, { secret: SECRET, onError: () => {}, ...options });
}

// The signature computed here independently of the package's own helper.
function sign(body, t = Math.floor(Date.now() / 1000), secret = SECRET) {
  const v1 = createHmac("sha256", secret).update(`${t}.${body}`).digest("hex");
  return `t=${t},v1=${v1}`;
}

function post(body, signature) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return new Request("http://app.test/outlive/hooks", {
    method: "POST",
    headers: { "content-type": "application/json", "Outlive-Signature": signature ?? sign(text) },
    body: text,
  });
}

const ada = { id: "user:ada", actor: "user:ada", accessSubject: "user:ada", scopes: null };
const bob = { id: "user:bob:read", actor: "user:bob", accessSubject: "user:bob", scopes: ["read"] };
const keysBody = (warehouse, extra = {}) => ({ op: "keys", app: "inventory", channel: "warehouse", scope: { warehouse }, viewer: ada, ...extra });

async function answer(response) {
  return { status: response.status, body: await response.json() };
}

describe("signatures", () => {
  test("a good signature is answered", async () => {
    assert.deepEqual(await answer(await handler()(post(keysBody("north")))), { status: 200, body: { keys: ["wh-north"] } });
  });

  test("a wrong signature, a wrong secret, a missing or malformed header are 401", async () => {
    const text = JSON.stringify(keysBody("north"));
    const t = Math.floor(Date.now() / 1000);
    const good = sign(text, t);
    const bad = [
      good.slice(0, -1) + (good.endsWith("0") ? "1" : "0"),
      sign(text, t, "another secret"),
      `t=${t},v1=abc`,
      `t=${t}`,
      `v1=${good.split("v1=")[1]}`,
      "garbage",
      "",
      sign(text + " ", t), // the body that was signed is not the body that came
    ];
    for (const signature of bad) {
      const before = calls.length;
      const r = await handler()(post(text, signature));
      assert.equal(r.status, 401, signature);
      assert.equal((await r.json()).error, "bad_signature");
      assert.equal(calls.length, before, "no channel function runs for a refused request");
    }
    const r = await handler()(new Request("http://app.test/", { method: "POST", body: text }));
    assert.equal(r.status, 401);
  });

  test("a t more than 5 minutes old or ahead is 401; within 5 minutes is answered", async () => {
    const text = JSON.stringify(keysBody("north"));
    const now = Math.floor(Date.now() / 1000);
    for (const [t, status] of [[now - 301, 401], [now - 3600, 401], [now + 301, 401], [now - 299, 200], [now + 299, 200]]) {
      const r = await handler()(post(text, sign(text, t)));
      assert.equal(r.status, status, `t = now ${t - now}`);
      if (status === 401) assert.match((await r.json()).message, /old|future/);
    }
  });

  test("a replayed request is refused once its t has aged past 5 minutes (the handler's clock)", async () => {
    const text = JSON.stringify(keysBody("north"));
    const t = 1_700_000_000;
    const signature = sign(text, t);
    assert.equal((await handler({ now: () => (t + 10) * 1000 })(post(text, signature))).status, 200);
    assert.equal((await handler({ now: () => (t + 301) * 1000 })(post(text, signature))).status, 401);
  });

  test("a list of secrets (a rotation) accepts either", async () => {
    const text = JSON.stringify(keysBody("north"));
    const h = handler({ secret: ["new", SECRET] });
    assert.equal((await h(post(text, sign(text)))).status, 200);
    assert.equal((await h(post(text, sign(text, undefined, "new")))).status, 200);
    assert.equal((await h(post(text, sign(text, undefined, "old")))).status, 401);
  });

  test("signHookBody and verifySignature agree with the independent computation", () => {
    const t = Math.floor(Date.now() / 1000);
    assert.equal(signHookBody(SECRET, "{}", t), sign("{}", t));
    assert.equal(verifySignature(sign("{}", t), "{}", SECRET), null);
    assert.match(verifySignature(sign("{}", t - 400), "{}", SECRET), /old/);
  });

  test("routes() needs a secret", () => {
    assert.throws(() => live.routes(channels, {}), /secret/);
    assert.throws(() => live.routes(channels, { secret: "" }), /secret/);
  });
});

describe("keys", () => {
  test("answers the keys, or null when keys() says not found", async () => {
    const h = handler();
    assert.deepEqual(await answer(await h(post(keysBody("south")))), { status: 200, body: { keys: ["wh-south"] } });
    assert.deepEqual(await answer(await h(post(keysBody("missing")))), { status: 200, body: { keys: null } });
    assert.deepEqual(calls.at(-1), ["keys", "missing", "user:ada"]);
  });

  test("a scope the channel's zod schema refuses is not found, without calling keys()", async () => {
    const before = calls.length;
    const r = await answer(await handler()(post({ ...keysBody("x"), scope: { warehouse: "x", extra: 1 } })));
    assert.deepEqual(r, { status: 200, body: { keys: null } });
    assert.equal(calls.length, before);
  });

  test("an unknown channel is 404 JSON; another app is 404; an unknown op is 400", async () => {
    const h = handler();
    let r = await answer(await h(post({ ...keysBody("north"), channel: "toString" })));
    assert.equal(r.status, 404);
    assert.equal(r.body.error, "unknown_channel");
    r = await answer(await h(post({ ...keysBody("north"), app: "billing" })));
    assert.equal(r.status, 404);
    assert.equal(r.body.error, "unknown_app");
    r = await answer(await h(post({ ...keysBody("north"), op: "delete" })));
    assert.equal(r.status, 400);
    r = await answer(await h(post("not json")));
    assert.equal(r.status, 400);
    assert.equal((await h(new Request("http://app.test/", { method: "GET" }))).status, 405);
  });

  test("keys() that throws or returns a wrong type is 500", async () => {
    const errors = [];
    const h = handler({ onError: (e) => errors.push(e) });
    const r = await answer(await h(post(keysBody("boom"))));
    assert.equal(r.status, 500);
    assert.equal(r.body.error, "internal");
    assert.doesNotMatch(JSON.stringify(r.body), /database down/, "the app's error stays in the app's log");
    assert.match(errors[0].message, /keys\(\) threw: database down/);
    assert.equal((await h(post(keysBody("wrong")))).status, 500);
  });
});

describe("authorize", () => {
  const body = (key, viewers) => ({ op: "authorize", app: "inventory", channel: "warehouse", key, viewers });

  test("answers the allowed ids among those asked", async () => {
    const h = handler();
    assert.deepEqual(await answer(await h(post(body("wh-north", [ada, bob])))), { status: 200, body: { allowed: ["user:ada", "user:bob:read"] } });
    assert.deepEqual(await answer(await h(post(body("wh-south", [ada, bob])))), { status: 200, body: { allowed: ["user:ada"] } });
    assert.deepEqual(await answer(await h(post(body("wh-south", [bob])))), { status: 200, body: { allowed: [] } });
  });

  test("500 viewers in one call reach authorize() once", async () => {
    const viewers = Array.from({ length: 500 }, (_, i) => ({ id: `user:${i}`, actor: `user:${i}`, accessSubject: i % 2 ? "user:ada" : `user:${i}`, scopes: null }));
    const before = calls.length;
    const r = await answer(await handler()(post(body("wh-south", viewers))));
    assert.equal(r.status, 200);
    assert.equal(r.body.allowed.length, 250);
    assert.deepEqual(calls.slice(before), [["authorize", "wh-south", 500]]);
  });

  test("authorize() that throws or answers a wrong type is 500; a malformed request is 400", async () => {
    const h = handler();
    assert.equal((await h(post(body("boom", [ada])))).status, 500);
    assert.equal((await h(post(body("wrong", [ada])))).status, 500);
    assert.equal((await h(post(body("wh-south", "ada")))).status, 400);
    assert.equal((await h(post(body(5, [ada])))).status, 400);
  });
});

describe("the credential hook", () => {
  const body = (credentials) => ({ app: "inventory", credentials });
  const authenticate = async ({ headers }) => {
    if (headers.cookie === "session=ada") return { viewer: { id: "user:ada", actor: "user:ada", accessSubject: "user:ada", scopes: null }, expiresInS: 120 };
    if (headers.authorization === "Bearer ci") return { viewer: { id: "service_account:ci:read", accessSubject: "service_account:ci", actor: "service_account:ci", scopes: ["read"] } };
    if (headers.cookie === "session=boom") throw new Error("session store down");
    if (headers.cookie === "session=expired") return { refused: "expired" };
    return null;
  };

  test("answers a result for every ref: a viewer with expires_in_s, or refused", async () => {
    const r = await answer(await handler({ authenticate })(post(body([
      { ref: "1", headers: { cookie: "session=ada" }, origin: "http://localhost:8080", address: "10.0.0.1" },
      { ref: "2", headers: { authorization: "Bearer ci" } },
      { ref: "3", headers: { cookie: "session=expired" } },
      { ref: "4", headers: {} },
    ]))));
    assert.deepEqual(r, {
      status: 200,
      body: {
        results: {
          1: { viewer: { id: "user:ada", actor: "user:ada", accessSubject: "user:ada", scopes: null }, expires_in_s: 120 },
          2: { viewer: { id: "service_account:ci:read", actor: "service_account:ci", accessSubject: "service_account:ci", scopes: ["read"] }, expires_in_s: 60 },
          3: { refused: "expired" },
          4: { refused: "unauthorized" },
        },
      },
    });
  });

  test("authenticate() that throws fails the whole call (500: the replica retries, never a refusal)", async () => {
    const r = await handler({ authenticate })(post(body([{ ref: "1", headers: { cookie: "session=ada" } }, { ref: "2", headers: { cookie: "session=boom" } }])));
    assert.equal(r.status, 500);
  });

  test("without authenticate the credential hook is 404; it is signed like the others", async () => {
    assert.equal((await handler()(post(body([{ ref: "1", headers: {} }])))).status, 404);
    const text = JSON.stringify(body([{ ref: "1", headers: { cookie: "session=ada" } }]));
    assert.equal((await handler({ authenticate })(post(text, sign(text, Math.floor(Date.now() / 1000) - 301)))).status, 401);
  });
});

test("the handler serves node:http through a small adapter (as the docs show)", async () => {
  const h = handler();
  const server = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const response = await h(new Request(`http://${req.headers.host}${req.url}`, { method: req.method, headers: req.headers, body: Buffer.concat(chunks) }));
    res.writeHead(response.status, Object.fromEntries(response.headers));
    res.end(Buffer.from(await response.arrayBuffer()));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const text = JSON.stringify(keysBody("east"));
    const r = await fetch(`http://127.0.0.1:${server.address().port}/hooks`, { method: "POST", headers: { "Outlive-Signature": sign(text) }, body: text });
    assert.equal(r.status, 200);
    assert.deepEqual(await r.json(), { keys: ["wh-east"] });
  } finally {
    server.close();
  }
});
