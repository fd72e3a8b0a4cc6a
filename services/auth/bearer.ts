// The client side of authentication: how every Connect client of skiff (the
// CLI, the dashboard, internal services, tests) sends its token. Free of
// skiff's own imports, so the CLI and browser code may import it directly.
import type { Interceptor } from "@connectrpc/connect";

/** An interceptor that sends `Authorization: Bearer <token>` with every call. */
export function bearerAuth(token: string): Interceptor {
  const value = `Bearer ${token}`;
  return (next) => (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}
