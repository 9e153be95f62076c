// Subscription filters (SPEC 5.2 rev 3), checked before they reach the server.

/** SPEC 5.2 rev 3: a subscription's filter compares at most this many top-level fields. */
export const MAX_FILTER_FIELDS = 8;

/**
 * Checks a subscription filter (SPEC 5.2 rev 3): a plain object of at most 8 fields whose values
 * are JSON scalars (string, finite number, boolean, null). The server answers an invalid filter
 * with `invalid_message`, which ends the subscription; checking here turns that into an exception
 * at the call that made the mistake.
 *
 * @param {unknown} filter
 * @returns {Record<string, string | number | boolean | null> | null} a copy, or null for no filter
 *   (undefined, null or an empty object: every update matches)
 * @throws {TypeError | RangeError} naming the offending field
 */
export function checkFilter(filter) {
  if (filter == null) return null;
  if (!isPlainObject(filter) || (Object.getPrototypeOf(filter) !== Object.prototype && Object.getPrototypeOf(filter) !== null)) {
    throw new TypeError("subscribe: filter must be a plain object of field: value");
  }
  const names = Object.keys(filter);
  if (names.length > MAX_FILTER_FIELDS) {
    throw new RangeError(`subscribe: filter has ${names.length} fields; at most ${MAX_FILTER_FIELDS} are allowed`);
  }
  const copy = {};
  for (const name of names) {
    const value = filter[name];
    const ok =
      value === null ||
      typeof value === "string" ||
      typeof value === "boolean" ||
      (typeof value === "number" && Number.isFinite(value)); // NaN and Infinity would be sent as null
    if (!ok) {
      const what = Array.isArray(value) ? "an array" : value === undefined ? "undefined" : typeof value === "number" ? String(value) : article(typeof value);
      throw new TypeError(`subscribe: filter field "${name}" is ${what}; values must be a string, a finite number, a boolean or null`);
    }
    copy[name] = value;
  }
  return names.length === 0 ? null : copy;
}

function isPlainObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function article(word) {
  return `${/^[aeiou]/.test(word) ? "an" : "a"} ${word}`;
}
