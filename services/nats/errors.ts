// Errors of the NATS wiring. As in nats.js, each has its own `name` and keeps
// the underlying error as `cause`, so callers can tell them apart and logs
// show the root of the problem.

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
