// Reconnect backoff of the outlive client (SPEC 5.7 close codes): full jitter, and a floor after 1013.

/** Defaults of every timing option, in milliseconds. */
export const DEFAULTS = Object.freeze({
  /** first reconnect delay ceiling; doubles with each failed attempt */
  base: 500,
  /** the reconnect delay ceiling never grows beyond this */
  cap: 30_000,
  /** the lowest delay after a close with 1013 (try again later) */
  overloadMinimum: 5_000,
  /** a connection that stayed open this long resets the backoff */
  stableAfter: 10_000,
  /** a socket that has not opened after this long is abandoned and retried */
  connectTimeout: 15_000,
});

/**
 * The delay before reconnect attempt `attempt` (0 for the first retry), in whole milliseconds.
 *
 * Full jitter: uniform over [minimum, ceiling) where ceiling = min(cap, base * 2^attempt), so that
 * a thousand tabs dropped at once do not come back in step. With a `minimum` (the floor after
 * close 1013) the ceiling is at least twice the minimum, so the floor keeps its spread too.
 * The minimum is itself capped at `cap`.
 *
 * @param {number} attempt failed attempts so far (negative or not a number counts as 0)
 * @param {{base?: number, cap?: number, minimum?: number, random?: () => number}} [options]
 * @returns {number}
 */
export function reconnectDelay(attempt, options = {}) {
  const base = positive(options.base, DEFAULTS.base);
  const cap = positive(options.cap, DEFAULTS.cap);
  const random = typeof options.random === "function" ? options.random : Math.random;
  const minimum = Math.min(cap, Math.max(0, Number(options.minimum) || 0));
  const n = Number.isFinite(attempt) && attempt > 0 ? Math.floor(attempt) : 0;
  const grown = base * 2 ** Math.min(n, 1024); // Infinity beyond, which the cap absorbs
  const ceiling = Math.min(cap, Math.max(grown, 2 * minimum));
  let r = Number(random());
  if (!(r > 0)) r = 0; // NaN and negatives count as 0
  if (r >= 1) r = 1 - Number.EPSILON;
  return Math.floor(minimum + r * (ceiling - minimum));
}

/** The first attempt whose ceiling reaches twice `minimum` (where 1013 starts the backoff). */
export function overloadAttempt(options = {}) {
  const base = positive(options.base, DEFAULTS.base);
  const minimum = Math.max(0, Number(options.minimum) || 0);
  if (minimum === 0) return 0;
  return Math.max(0, Math.ceil(Math.log2((2 * minimum) / base)));
}

/** `value` as a number when it is finite and above 0, else `fallback` (timing options). */
export function positive(value, fallback) {
  const n = Number(value);
  return Number.isFinite(n) && n > 0 ? n : fallback;
}
