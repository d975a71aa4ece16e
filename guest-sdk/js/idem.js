// Idem handlers in JavaScript.
//
// A handler is a function of one Message, wrapped with `handler` and exported
// as `handle` (the function Idem's WIT world exports). It sees only what is
// safe to repeat: `collection(name)` for unique inserts, upserts, reads and
// deletes of JSON values, `call` for keyed external calls whose answers Idem
// journals, and the log functions. Returning means done. Throw `Permanent`
// to dead-letter the message at once, `Transient` (or any other error) to
// have it retried with backoff.
//
//     import { handler, collection } from "./idem.js";
//
//     export const handle = handler((msg) => {
//       const grant = msg.json();
//       collection("credits").upsert(grant.user, grant.balance);
//     });
//
// Build with `idem plugin build DIR` (componentize-js, every WASI feature
// disabled, so the component imports nothing but idem:handler/*).

import * as store from "idem:handler/store@0.2.0";
import * as effects from "idem:handler/effects@0.2.0";
import { log } from "idem:handler/log@0.2.0";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A failure worth retrying (an API down, a store unreachable). */
export class Transient extends Error {
  constructor(message) {
    super(message);
    this.name = "Transient";
  }
}

/** A failure no retry will fix (invalid input): dead-lettered at once. */
export class Permanent extends Error {
  constructor(message) {
    super(message);
    this.name = "Permanent";
  }
}

/** One message, as delivered and admitted by its claim. */
export class Message {
  constructor(raw) {
    /** The producer's message id. */
    this.id = raw.id;
    /** The idempotency key (the message id, or the configured key pointer's value). */
    this.key = raw.key;
    /** 1 for the first execution. */
    this.attempt = raw.attempt;
    /** Headers as delivered: [name, value] pairs. */
    this.headers = raw.headers;
    /** The payload as delivered. */
    this.payload = raw.payload;
  }

  /** The payload as text (UTF-8). */
  text() {
    return decoder.decode(this.payload);
  }

  /** The payload parsed as JSON; invalid JSON is a Permanent error. */
  json() {
    try {
      return JSON.parse(this.text());
    } catch (e) {
      throw new Permanent(`payload is not valid JSON: ${e.message}`);
    }
  }

  /** The first header called `name` (case-insensitive), if any. */
  header(name) {
    const lowered = name.toLowerCase();
    const found = this.headers.find(([k]) => k.toLowerCase() === lowered);
    return found === undefined ? undefined : found[1];
  }
}

function encode(value) {
  const text = JSON.stringify(value);
  if (text === undefined) {
    throw new Permanent(`cannot store ${typeof value} as JSON`);
  }
  return encoder.encode(text);
}

function decode(bytes) {
  return JSON.parse(decoder.decode(bytes));
}

// The generated bindings throw an error whose `payload` is the WIT error
// variant ({ tag, val }).
function variantOf(e) {
  return e !== null && typeof e === "object" && "payload" in e ? e.payload : undefined;
}

function storeCall(f) {
  try {
    return f();
  } catch (e) {
    const v = variantOf(e);
    if (v === undefined) throw e;
    if (v.tag === "unavailable") throw new Transient(`store unavailable: ${v.val}`);
    throw new Permanent(`${v.tag}: ${v.val}`);
  }
}

/** A named collection the plugin was granted; values are JSON. */
export class Collection {
  constructor(name) {
    this.name = name;
  }

  /** Insert unless `key` exists: undefined if inserted, else the value it holds. */
  insertUnique(key, value) {
    const r = storeCall(() => store.insertUnique(this.name, key, encode(value)));
    return r.tag === "existed" ? decode(r.val) : undefined;
  }

  /** Set `key` to `value`, whatever it held: an absolute assignment. */
  upsert(key, value) {
    storeCall(() => store.upsert(this.name, key, encode(value)));
  }

  /** The value of `key`, or undefined. */
  get(key) {
    const raw = storeCall(() => store.get(this.name, key));
    return raw === undefined || raw === null ? undefined : decode(raw);
  }

  /** Delete `key`; true if it existed. */
  delete(key) {
    return storeCall(() => store.delete(this.name, key));
  }
}

/** The collection `name` (granted in `plugins.NAME.collections`). */
export function collection(name) {
  return new Collection(name);
}

/**
 * Call a granted endpoint with a JSON request; return its JSON answer.
 *
 * `step` names the call within the handler: Idem sends it with an
 * Idempotency-Key derived from the message key and the step, journals the
 * answer, and replays it on a later attempt instead of calling again.
 */
export function call(endpoint, step, request) {
  let raw;
  try {
    raw = effects.call(endpoint, step, encode(request));
  } catch (e) {
    const v = variantOf(e);
    if (v === undefined) throw e;
    if (v.tag === "transient") throw new Transient(`${endpoint}/${step}: ${v.val}`);
    throw new Permanent(`${endpoint}/${step}: ${v.val}`);
  }
  return decode(raw);
}

/** Log lines into the host's log, tagged with the message key, plugin and attempt. */
export const trace = (message) => log("trace", String(message));
export const debug = (message) => log("debug", String(message));
export const info = (message) => log("info", String(message));
export const warn = (message) => log("warn", String(message));
export const error = (message) => log("error", String(message));

// What the host receives for a failure: the WIT handler-error variant.
class HandlerError extends Error {
  constructor(tag, text) {
    super(text);
    this.payload = { tag, val: text };
  }
}

/**
 * Wrap `fn` as the plugin's handler; export the result as `handle`.
 * Permanent → dead-lettered; Transient or any other error → retried. What
 * `fn` returns, unless undefined or null, is the message's result, as JSON.
 */
export function handler(fn) {
  return function handle(raw) {
    try {
      const value = fn(new Message(raw));
      if (value === undefined || value === null) return undefined;
      let text;
      try {
        text = JSON.stringify(value);
      } catch (e) {
        throw new Permanent(`the handler returned a value JSON cannot hold: ${e.message}`);
      }
      if (text === undefined) throw new Permanent("the handler returned a value JSON cannot hold");
      return encoder.encode(text);
    } catch (e) {
      if (e instanceof Permanent) throw new HandlerError("permanent", e.message);
      if (e instanceof Transient) throw new HandlerError("transient", e.message);
      const name = e instanceof Error ? e.name : typeof e;
      const text = e instanceof Error ? e.message : String(e);
      throw new HandlerError("transient", `${name}: ${text}`);
    }
  };
}
