// What a run asks of a runner and what it gets back: the contract between the
// gateway (in-process or over NATS, see wire.ts) and the runner.

export interface InvokeRequest {
  runId: string;
  method: string;
  /** After the app name: "/fn" (or "fn") for a Cortex app, any path for a Custom one. */
  path: string;
  /** Without the leading "?"; "" for none. */
  query: string;
  /** Lower-case names; only those that apps get (see server/headers.ts). */
  headers: Record<string, string>;
  body: Uint8Array;
  signal?: AbortSignal;
}

export interface InvokeResponse {
  status: number;
  /** Those the replica sent that its caller gets, Content-Type among them (see server/headers.ts); set-cookie may repeat. */
  headers: Record<string, string | string[]>;
  body: Uint8Array;
  /** From handing the request to a replica to the end of its response. */
  runTimeMs: number;
  replicaId: string;
}
