// What a run asks of a runner and what it gets back: the contract between the
// gateway (in-process or over NATS, see wire.ts) and the runner.

export interface InvokeRequest {
  runId: string;
  method: string;
  /** After the app name: "/fn" (or "fn") for a Cortex app, any path for a Custom one. */
  path: string;
  /** Without the leading "?"; "" for none. */
  query: string;
  /** Lower-case names. Hop-by-hop headers and Host are not forwarded. */
  headers: Record<string, string>;
  body: Uint8Array;
  signal?: AbortSignal;
}

export interface InvokeResponse {
  status: number;
  /** As the replica sent them, but for hop-by-hop headers; set-cookie may repeat. */
  headers: Record<string, string | string[]>;
  body: Uint8Array;
  /** From handing the request to a replica to the end of its response. */
  runTimeMs: number;
  replicaId: string;
}
