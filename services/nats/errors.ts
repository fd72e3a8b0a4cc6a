// Errors of the NATS wiring. As in nats.js, each has its own `name` and keeps
// the underlying error as `cause`, so callers can tell them apart and logs
// show the root of the problem. Below them: the JetStream API's own error
// codes, and how to read them off an error nats.js threw.
import { NatsError } from "nats";
import { PublishError } from "./acked-publish.js";

/** No local nats-server could be started (missing binary, early exit, not ready in time). */
export class NatsStartError extends Error {
  override name = "NatsStartError";
}

/** The NATS server named by SKIFF_NATS_URL (or a started one) did not accept a connection. */
export class NatsConnectError extends Error {
  override name = "NatsConnectError";
}

/** The server answers but JetStream is off, and skiff keeps all shared state in JetStream. */
export class JetStreamDisabledError extends Error {
  override name = "JetStreamDisabledError";
}

/** A stream, KV bucket or object store of the layout could not be created or updated. */
export class NatsProvisionError extends Error {
  override name = "NatsProvisionError";
}

/** The message of an unknown thrown value, for wrapping it in one of the errors above. */
export function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * JetStream API error codes that skiff tells apart (`err_code` of the API's
 * answer; the list is nats-server's server/errors.json).
 */
export enum JsErrorCode {
  ConsumerNotFound = 10014,
  /** The server cannot reserve a stream's `max_bytes` (its store is smaller than the budgets together). */
  InsufficientResources = 10047,
  NoMessageFound = 10037,
  StreamNameInUse = 10058,
  StreamNotFound = 10059,
  /** A create racing another process's create of the same stream may be refused with this. */
  StreamSubjectOverlap = 10065,
  /** A compare-and-set (expected last sequence, a KV update or create) lost to another write. */
  WrongLastSequence = 10071,
  /** A message was not stored; with the description "maximum bytes exceeded", a discard-new stream is at its `max_bytes`. */
  StreamStoreFailed = 10077,
}

/** The JetStream API error code of an error nats.js threw, or undefined when it is not an API error. */
export function jsErrorCode(err: unknown): number | undefined {
  if (err instanceof PublishError) return err.apiCode;
  return err instanceof NatsError ? err.api_error?.err_code : undefined;
}

/** Whether `err` is the JetStream API's answer `code`. */
export function isJsError(err: unknown, code: JsErrorCode): boolean {
  return jsErrorCode(err) === code;
}

/** Whether a publish was refused because its stream (discard new) is at its `max_bytes`: its budget. */
export function isStreamFull(err: unknown): boolean {
  if (jsErrorCode(err) !== JsErrorCode.StreamStoreFailed) return false;
  return /maximum bytes exceeded/i.test(err instanceof Error ? err.message : String(err));
}
