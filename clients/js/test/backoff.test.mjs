// The reconnect schedule: full jitter, the cap, growth with the attempt, the 1013 floor.
import { test } from "node:test";
import assert from "node:assert/strict";
import { reconnectDelay, overloadAttempt, DEFAULTS } from "../outlive.js";

/** A deterministic uniform source (mulberry32), so a failure reproduces. */
function seeded(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function samples(attempt, options, n = 2000) {
  const random = seeded(attempt * 7919 + 17);
  return Array.from({ length: n }, () => reconnectDelay(attempt, { random, ...options }));
}

test("defaults are base 500 ms, cap 30 s, 1013 floor 5 s", () => {
  assert.equal(DEFAULTS.base, 500);
  assert.equal(DEFAULTS.cap, 30_000);
  assert.equal(DEFAULTS.overloadMinimum, 5_000);
});

test("full jitter: many samples for one attempt are spread over [0, ceiling)", () => {
  for (const attempt of [0, 3, 10]) {
    const ceiling = Math.min(30_000, 500 * 2 ** attempt);
    const xs = samples(attempt);
    const distinct = new Set(xs).size;
    // whole milliseconds: at most `ceiling` different values exist
    const expected = Math.min(xs.length * 0.4, ceiling * 0.9);
    assert.ok(distinct > expected, `attempt ${attempt}: only ${distinct} distinct delays`);
    assert.ok(Math.min(...xs) >= 0);
    assert.ok(Math.max(...xs) < ceiling, `attempt ${attempt}: a delay reached the ceiling ${ceiling}`);
    // spread over the whole range, not bunched: each tenth of [0, ceiling) gets some samples
    const buckets = new Array(10).fill(0);
    for (const x of xs) buckets[Math.floor((x / ceiling) * 10)]++;
    for (const [i, count] of buckets.entries()) {
      assert.ok(count > xs.length / 10 / 2, `attempt ${attempt}: bucket ${i} has only ${count}`);
    }
    const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
    assert.ok(Math.abs(mean - ceiling / 2) < ceiling * 0.05, `attempt ${attempt}: mean ${mean}`);
  }
});

test("the delay is random() times the ceiling, in whole milliseconds", () => {
  assert.equal(reconnectDelay(0, { random: () => 0 }), 0);
  assert.equal(reconnectDelay(0, { random: () => 0.5 }), 250);
  assert.equal(reconnectDelay(1, { random: () => 0.5 }), 500);
  assert.equal(reconnectDelay(4, { random: () => 0.5 }), 4000);
  assert.equal(reconnectDelay(4, { random: () => 0.25, base: 100, cap: 1000 }), 250);
  assert.ok(Number.isInteger(reconnectDelay(2, { random: () => 0.123456 })));
});

test("the ceiling grows with the attempt up to the cap, and never beyond", () => {
  const high = () => 1 - 1e-12;
  let previous = -1;
  for (let attempt = 0; attempt <= 60; attempt++) {
    const d = reconnectDelay(attempt, { random: high });
    assert.ok(d <= 30_000, `attempt ${attempt}: ${d} above the cap`);
    assert.ok(d >= previous, `attempt ${attempt}: ${d} smaller than ${previous}`);
    if (500 * 2 ** attempt < 30_000) assert.ok(d > previous, `attempt ${attempt} did not grow`);
    previous = d;
  }
  assert.equal(reconnectDelay(6, { random: high }), 29_999); // 500 * 64 = 32000 → capped
  for (const attempt of [7, 50, 1000, 1e9, Infinity]) {
    for (const x of samples(Math.min(attempt, 1e9), {}, 200)) assert.ok(x >= 0 && x <= 30_000);
    assert.ok(reconnectDelay(attempt, { random: high }) <= 30_000);
  }
  // a random source that misbehaves cannot break the bounds
  assert.ok(reconnectDelay(3, { random: () => 1 }) < 4000);
  assert.ok(reconnectDelay(3, { random: () => 7 }) < 4000);
  assert.equal(reconnectDelay(3, { random: () => -1 }), 0);
  assert.equal(reconnectDelay(3, { random: () => NaN }), 0);
});

test("nonsense attempts count as the first", () => {
  for (const attempt of [-1, NaN, undefined, null, "x"]) {
    assert.equal(reconnectDelay(attempt, { random: () => 0.5 }), 250);
  }
});

test("the 1013 floor: never below the minimum, still jittered, still capped", () => {
  for (let attempt = 0; attempt <= 12; attempt++) {
    const xs = samples(attempt, { minimum: 5_000 }, 1000);
    assert.ok(Math.min(...xs) >= 5_000, `attempt ${attempt}: below the floor`);
    assert.ok(Math.max(...xs) <= 30_000, `attempt ${attempt}: above the cap`);
    assert.ok(new Set(xs).size > 500, `attempt ${attempt}: not spread`);
    assert.ok(Math.max(...xs) - Math.min(...xs) > 4_000, `attempt ${attempt}: spread too narrow`);
  }
  assert.equal(reconnectDelay(0, { minimum: 5_000, random: () => 0 }), 5_000);
  assert.equal(reconnectDelay(0, { minimum: 5_000, random: () => 0.5 }), 7_500); // [5 s, 10 s)
  // a floor above the cap is the cap
  assert.equal(reconnectDelay(0, { minimum: 60_000, random: () => 0 }), 30_000);
  assert.equal(reconnectDelay(0, { minimum: 60_000, random: () => 0.9 }), 30_000);
});

test("1013 starts the backoff at the attempt whose ceiling is twice the floor", () => {
  assert.equal(overloadAttempt({ base: 500, minimum: 5_000 }), 5); // 500 * 2^5 = 16 s ≥ 10 s
  assert.equal(overloadAttempt({ base: 500, minimum: 0 }), 0);
  assert.equal(overloadAttempt({ base: 1_000, minimum: 1_000 }), 1);
  const a = overloadAttempt({ base: 500, minimum: 5_000 });
  assert.ok(500 * 2 ** a >= 10_000 && 500 * 2 ** (a - 1) < 10_000);
});
