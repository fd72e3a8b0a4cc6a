// The runner's public shapes, free of NATS so that the runner role and the
// in-process gateway path can both call a Runner directly.
import type { AppConfig } from "../shared/app-config.js";

export interface AppDeployment {
  projectId: string;
  appName: string;
  version: number;
  /**
   * The unpacked app folder. prepareDeployment writes node_modules/ and
   * .skiff/ into it; replicas get a copy and never write to it.
   */
  dir: string;
  config: AppConfig;
  /** The result of prepareDeployment on `dir`, when the caller already ran it. */
  prepared?: PreparedDeployment;
}

export interface PreparedDeployment {
  /** Cortex: the public function names, known without a replica. */
  functions?: string[];
  /** Cortex Python with a requirements.txt: the interpreter of its venv. */
  python?: string;
}

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

export type ReplicaState = "starting" | "ready" | "draining" | "stopped";

export interface ReplicaInfo {
  replicaId: string;
  state: ReplicaState;
  /** False while a readycheck fails: alive, but given no requests. */
  routable: boolean;
  inFlight: number;
  deploymentVersion: number;
  startedAt: Date;
  pid: number | undefined;
}

export interface AppLogLine {
  projectId: string;
  appName: string;
  replicaId: string;
  stream: "stdout" | "stderr";
  /** Set when the replica was running exactly one request. */
  runId?: string;
  text: string;
  time: Date;
}

export interface ReplicaChange {
  projectId: string;
  appName: string;
  replica: ReplicaInfo;
}
