// Types of the Idem JavaScript SDK (idem.js).

/** A JSON value as JSON.parse returns it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A failure worth retrying (an API down, a store unreachable). */
export class Transient extends Error {
  constructor(message: string);
}

/** A failure no retry will fix (invalid input): dead-lettered at once. */
export class Permanent extends Error {
  constructor(message: string);
}

/** The message record of Idem's WIT world, as the bindings pass it. */
export interface RawMessage {
  id: string;
  key: string;
  attempt: number;
  headers: Array<[string, string]>;
  payload: Uint8Array;
}

/** One message, as delivered and admitted by its claim. */
export class Message {
  constructor(raw: RawMessage);
  /** The producer's message id. */
  readonly id: string;
  /** The idempotency key (the message id, or the configured key pointer's value). */
  readonly key: string;
  /** 1 for the first execution. Informational: never let it change what is written. */
  readonly attempt: number;
  /** Headers as delivered: [name, value] pairs. */
  readonly headers: Array<[string, string]>;
  /** The payload as delivered. */
  readonly payload: Uint8Array;
  /** The payload as text (UTF-8). */
  text(): string;
  /** The payload parsed as JSON; invalid JSON throws Permanent. */
  json<T = Json>(): T;
  /** The first header called `name` (case-insensitive), if any. */
  header(name: string): string | undefined;
}

/** A named collection the plugin was granted; values are JSON. */
export class Collection {
  constructor(name: string);
  readonly name: string;
  /** Insert unless `key` exists: undefined if inserted, else the value it holds. */
  insertUnique<T = Json>(key: string, value: unknown): T | undefined;
  /** Set `key` to `value`, whatever it held: an absolute assignment. */
  upsert(key: string, value: unknown): void;
  /** The value of `key`, or undefined. */
  get<T = Json>(key: string): T | undefined;
  /** Delete `key`; true if it existed. */
  delete(key: string): boolean;
}

/** The collection `name` (granted in `plugins.NAME.collections`). */
export function collection(name: string): Collection;

/**
 * Call a granted endpoint with a JSON request; return its JSON answer.
 * `step` must be stable across attempts: Idem journals the answer under
 * (message key, step) and replays it instead of calling again.
 */
export function call<T = Json>(endpoint: string, step: string, request: unknown): T;

export function trace(message: string): void;
export function debug(message: string): void;
export function info(message: string): void;
export function warn(message: string): void;
export function error(message: string): void;

/**
 * Wrap `fn` as the plugin's handler; export the result as `handle`.
 * Permanent → dead-lettered; Transient or any other error → retried. What
 * `fn` returns, unless undefined or null, is the message's result, as JSON.
 */
export function handler(fn: (msg: Message) => unknown): (raw: RawMessage) => Uint8Array | undefined;
