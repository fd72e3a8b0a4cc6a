// The runner's own shapes: deployments, replicas and their log lines. What
// a run asks of a runner and gets back is the runs domain's (runs/invoke.ts);
// what preparing a deployment learns is the apps domain's, named here too
// for the runner's modules.
import type { AppConfig, PreparedDeployment } from "../apps/index.js";

export type { PreparedDeployment };

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
