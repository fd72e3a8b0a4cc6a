// A WebSocket to a Custom app: the caller's upgrade request goes to a
// replica over a connection of its own (never the keep-alive pool), and the
// app does its own handshake. Its 101 answer hands over the connection; any
// other answer (the app refused) comes back whole, as an HTTP answer does.
//
//   const answer = await runner.upgrade(projectId, appName, { runId, path, query, headers, signal });
//   if (answer.kind === "upgraded") pipe(answer.socket) … answer.release() is automatic on close
import http from "node:http";
import type { Duplex } from "node:stream";
import type { UpgradeAnswer, UpgradeRequest } from "../runner-client/index.js";
import { appRequestHeaders } from "../server/index.js";

export type { UpgradeAnswer, UpgradeRequest };

/** The app's 101 and its connection, before the pool gives it a replica id. */
interface Upgraded {
  kind: "upgraded";
  status: number;
  headers: http.IncomingHttpHeaders;
  /** The connection to the app; its replica slot is given back when it closes. */
  socket: Duplex;
  /** Bytes the app sent right after its 101. */
  head: Buffer;
}

interface Answered {
  kind: "answered";
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** The app did not answer the handshake in time (its replica is not taken for broken). */
export class UpgradeTimeout extends Error {
  override name = "UpgradeTimeout";
}

/** The most of an app's refusal (a non-101 answer to the upgrade) that is read and passed on. */
const MAX_REFUSAL_BYTES = 64 * 1024;

/** Where a replica is reached (Replica.address). */
export type ReplicaAddress = { socketPath?: string; host: string; port: number };

/** The upgrade request's headers for the app: those apps get, the run id, and the upgrade itself. */
export function upgradeHeaders(headers: Record<string, string>, runId: string): http.OutgoingHttpHeaders {
  return {
    ...appRequestHeaders(Object.entries(headers)),
    connection: "Upgrade",
    upgrade: "websocket",
    "x-request-id": runId,
  };
}

/**
 * Sends the upgrade request to a replica, on a connection of its own, and
 * resolves with its answer; rejects when the connection fails, the app does
 * not answer within `timeoutMs`, or `signal` aborts.
 */
export function sendUpgrade(
  address: ReplicaAddress,
  req: UpgradeRequest,
  timeoutMs: number,
): Promise<Upgraded | Answered> {
  return new Promise((resolve, reject) => {
    const path = req.query === "" ? req.path : `${req.path}?${req.query}`;
    const request = http.request({
      ...address,
      method: "GET",
      path,
      headers: upgradeHeaders(req.headers, req.runId),
      agent: false,
    });
    const timer = setTimeout(
      () =>
        request.destroy(new UpgradeTimeout(`the app did not answer the WebSocket handshake within ${timeoutMs} ms`)),
      timeoutMs,
    );
    const onAbort = () => request.destroy(new Error("the caller went away"));
    req.signal?.addEventListener("abort", onAbort, { once: true });
    const done = () => {
      clearTimeout(timer);
      req.signal?.removeEventListener("abort", onAbort);
    };
    request.on("upgrade", (res, socket, head) => {
      done();
      socket.setNoDelay(true);
      resolve({ kind: "upgraded", status: res.statusCode ?? 101, headers: res.headers, socket, head });
    });
    request.on("response", (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (c: Buffer) => {
        if (size >= MAX_REFUSAL_BYTES) return;
        chunks.push(c.subarray(0, MAX_REFUSAL_BYTES - size));
        size += c.length;
      });
      const finish = () => {
        done();
        resolve({ kind: "answered", status: res.statusCode ?? 502, headers: res.headers, body: Buffer.concat(chunks) });
      };
      res.on("end", finish);
      res.on("error", finish);
    });
    request.on("error", (err) => {
      done();
      reject(err);
    });
    if (req.signal?.aborted) onAbort();
    request.end();
  });
}
