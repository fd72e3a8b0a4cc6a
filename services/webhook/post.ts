// One delivery attempt: a POST over node:http/https. Redirects are never
// followed (a 3xx is just a status for the retry table), the whole attempt has
// one deadline, and the connection only reaches addresses the AddressGuard
// allows: names through its `lookup` hook, IP literals (which Node connects to
// without a lookup) by a check before connecting.
import http from "node:http";
import https from "node:https";
import net from "node:net";
import { BlockedAddressError, type AddressGuard } from "../webhooks/index.js";

export interface AttemptResult {
  /** The receiver's HTTP status; undefined when no answer came. */
  status?: number;
  /** Why no answer came. */
  error?: string;
  /** True when retrying cannot help (the address is refused): the delivery fails at once. */
  permanent?: boolean;
  durationMs: number;
}

interface PostOptions {
  url: URL;
  body: Uint8Array;
  headers: Record<string, string>;
  timeoutMs: number;
  guard: AddressGuard;
}

export function postWebhook(opts: PostOptions): Promise<AttemptResult> {
  const started = performance.now();
  const elapsed = () => Math.round(performance.now() - started);
  const host = opts.url.hostname.startsWith("[") ? opts.url.hostname.slice(1, -1) : opts.url.hostname;
  if (net.isIP(host) !== 0 && opts.guard.isBlocked(host)) {
    return Promise.resolve({
      error: new BlockedAddressError(opts.url.hostname, host).message,
      permanent: true,
      durationMs: elapsed(),
    });
  }
  const request = opts.url.protocol === "https:" ? https.request : http.request;
  return new Promise((resolve) => {
    let settled = false;
    const finish = (r: Omit<AttemptResult, "durationMs">) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      // The answer's status is all a delivery needs; its body is not read.
      req.destroy();
      resolve({ ...r, durationMs: elapsed() });
    };
    const req = request({
      method: "POST",
      host,
      port: opts.url.port === "" ? undefined : Number(opts.url.port),
      path: opts.url.pathname + opts.url.search,
      headers: { ...opts.headers, "content-length": String(opts.body.byteLength) },
      lookup: opts.guard.lookup,
      // A fresh connection per attempt: a pooled socket would skip the guard's lookup.
      agent: false,
    });
    const timer = setTimeout(() => finish({ error: `no answer within ${opts.timeoutMs} ms` }), opts.timeoutMs);
    req.on("response", (res) => finish({ status: res.statusCode }));
    req.on("error", (err: NodeJS.ErrnoException) =>
      finish(
        err.code === "EBLOCKED"
          ? { error: err.message, permanent: true }
          : { error: err.message || err.code || "network error" },
      ),
    );
    req.end(opts.body);
  });
}
