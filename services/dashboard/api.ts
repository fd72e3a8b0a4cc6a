// The one way the dashboard talks to skiff: a ManagementService client over
// Connect-Web on this origin, sending the signed-in token.
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../auth/bearer.js";

export type Management = Client<typeof ManagementService>;

/**
 * A client sending `token`. `onRefused` is called when skiff refuses the
 * token (expired, deleted, rotated), so the app can send the user back to
 * the sign-in page instead of showing the same error on every page.
 */
export function managementClient(token: string, onRefused?: () => void): Management {
  const refused: Interceptor = (next) => async (req) => {
    try {
      return await next(req);
    } catch (err) {
      if (ConnectError.from(err).code === Code.Unauthenticated) onRefused?.();
      throw err;
    }
  };
  return createClient(
    ManagementService,
    createConnectTransport({ baseUrl: location.origin, interceptors: [refused, bearerAuth(token)] }),
  );
}

/** What went wrong and what to do about it, for the person looking at the page. */
export function describeError(err: unknown): string {
  const e = ConnectError.from(err);
  switch (e.code) {
    case Code.Unauthenticated:
      return "skiff refused the token: it may be mistyped, expired, or its service account deleted. Sign in again with a valid token.";
    case Code.PermissionDenied:
      return `This token may not do that: ${e.rawMessage}`;
    case Code.NotFound:
      return `Not found: ${e.rawMessage}`;
    case Code.Unimplemented:
      return `This skiff does not offer that yet (${e.rawMessage || "unimplemented"}).`;
    case Code.Unavailable:
      return `skiff is not reachable right now (${e.rawMessage}). Check that it is running, then try again.`;
    case Code.Canceled:
      return "The request was cancelled.";
    default:
      return e.rawMessage || e.message;
  }
}

export function isCode(err: unknown, code: Code): boolean {
  return ConnectError.from(err).code === code;
}
