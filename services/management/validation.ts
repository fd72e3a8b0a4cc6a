// Checks of management requests. Each failure is `invalid_argument` (HTTP 400)
// with a message that names the field and says what is accepted.
import { Code, ConnectError } from "@connectrpc/connect";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { exampleExpiry, PROJECT_ID, SERVICE_ACCOUNT_ID } from "../auth/index.js";

const MAX_NAME_LENGTH = 64;
/** Longest a service account may live: one year, a leap year included. */
const MAX_EXPIRY_MS = 366 * 24 * 60 * 60 * 1000;

function invalid(message: string): ConnectError {
  return new ConnectError(message, Code.InvalidArgument);
}

export function projectId(value: string): string {
  if (!PROJECT_ID.test(value))
    throw invalid(
      `project_id must be "p-" followed by 1 to 40 lowercase letters or digits, got ${JSON.stringify(value.slice(0, 80))}`,
    );
  return value;
}

/** A malformed id cannot name an existing account: that is a 404, like any unknown id. */
export function serviceAccountIdOrNotFound(value: string): string {
  if (!SERVICE_ACCOUNT_ID.test(value))
    throw new ConnectError(`service account ${JSON.stringify(value.slice(0, 80))} not found`, Code.NotFound);
  return value;
}

export function name(value: string, field: string, required: boolean): string {
  const length = [...value].length;
  if (required && length === 0) throw invalid(`${field} is required (1 to ${MAX_NAME_LENGTH} characters)`);
  if (length > MAX_NAME_LENGTH) throw invalid(`${field} must be at most ${MAX_NAME_LENGTH} characters, got ${length}`);
  return value;
}

/** The expiry of a new service account, in whole seconds (it becomes the token's `exp`). */
export function expiry(value: Timestamp | undefined, now = Date.now()): Date {
  if (value === undefined)
    throw invalid(
      `expires_at is required: an RFC 3339 time in the future, at most one year ahead (e.g. ${exampleExpiry(now)})`,
    );
  const ms = Math.floor(timestampDate(value).getTime() / 1000) * 1000;
  if (ms <= now) throw invalid(`expires_at must be in the future, got ${new Date(ms).toISOString()}`);
  if (!Number.isFinite(ms) || ms > now + MAX_EXPIRY_MS)
    throw invalid(
      `expires_at must be at most one year ahead (before ${new Date(now + MAX_EXPIRY_MS).toISOString()}), got ${Number.isFinite(ms) ? new Date(ms).toISOString() : "a time out of range"}`,
    );
  return new Date(ms);
}
