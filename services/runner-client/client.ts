// How a gateway reaches the runner of an app: one RunnerClient for sync runs
// (whole and streamed bodies both ways) and WebSocket upgrades, whatever
// carries them. In-process when this process's runner hosts the app (a NATS
// round trip costs about as much as the rest of the gateway); otherwise over
// NATS to a runner that does (nats.ts). The runner role hands its runner over
// as a HostedRunner; the domain knows nothing else of it.
//
//   const runners = runnerClient({ local: hostedRunner, remote: new NatsRunnerClient(nc, transfer) });
//   const res = await runners.invoke(app, request);
import type http from "node:http";
import type { Duplex } from "node:stream";
import type { AppRecord } from "../apps/index.js";
import { NoRunner, type InvokeRequest, type InvokeResponse } from "../runs/index.js";
import type { CallSignal } from "../server/index.js";

export interface UpgradeRequest {
  runId: string;
  /** The app's path as the caller wrote it, with its leading "/". */
  path: string;
  /** The caller's query, less skiff's own parameters; "" for none. */
  query: string;
  /** The caller's headers that apps get (see server/headers.ts); Connection and Upgrade are set by the runner. */
  headers: Record<string, string>;
  /** Aborted when the caller goes away while its connection is being set up. */
  signal?: AbortSignal;
}

export type UpgradeAnswer =
  | {
      kind: "upgraded";
      /** The app's 101 answer. */
      status: number;
      headers: http.IncomingHttpHeaders;
      /** The connection to the app (a socket, or the byte stream to another process's runner); its replica slot is given back when it closes. */
      socket: Duplex;
      /** Bytes the app sent right after its 101. */
      head: Buffer;
      replicaId: string;
      /** Settles when the replica's process has ended (at once if it has). */
      replicaExited(): Promise<void>;
    }
  | {
      kind: "answered";
      status: number;
      headers: http.IncomingHttpHeaders;
      body: Buffer;
      replicaId: string;
    };

/** A runner as the runner role hands it to this domain: what it runs, and which apps (at which version) it hosts. */
export interface HostedRunner {
  invoke(projectId: string, appName: string, req: InvokeRequest): Promise<InvokeResponse>;
  upgrade(projectId: string, appName: string, req: UpgradeRequest): Promise<UpgradeAnswer>;
  /** The version of the app deployed here, or undefined. */
  version(projectId: string, appName: string): number | undefined;
}

/** What a gateway calls: a run of the app, or a WebSocket to it. */
export interface RunnerClient {
  /** The app's answer (streamed only when `req.acceptStream` and the app streams it), or a runner error. */
  invoke(app: AppRecord, req: InvokeRequest): Promise<InvokeResponse>;
  /** The app's answer to a WebSocket handshake; NoRunner when no runner hosts the app. */
  upgrade(app: AppRecord, req: UpgradeRequest): Promise<UpgradeAnswer>;
}

/** A runner of this process, called directly. */
class InProcessClient implements RunnerClient {
  constructor(private readonly runner: HostedRunner) {}

  invoke(app: AppRecord, req: InvokeRequest): Promise<InvokeResponse> {
    return this.runner.invoke(app.project_id, app.app_name, req);
  }

  upgrade(app: AppRecord, req: UpgradeRequest): Promise<UpgradeAnswer> {
    return this.runner.upgrade(app.project_id, app.app_name, req);
  }
}

/** How long after a deploy a call waits for this process's runner to have the app, rather than going elsewhere. */
const FRESH_DEPLOY_MS = 2 * 60_000;
const FRESH_DEPLOY_WAIT_MS = 30_000;
const FRESH_DEPLOY_POLL_MS = 50;

/**
 * Whether `runner` has the app: waiting (bounded) for a deployment it is
 * still preparing. Right after a deploy this process's runner is still
 * fetching and preparing the new app: a call then waits for it instead of
 * failing at once. (A gateway without a runner of its own cannot know
 * whether one is coming.)
 */
async function hosts(runner: HostedRunner, app: AppRecord, signal: CallSignal | undefined): Promise<boolean> {
  const age = Date.now() - Date.parse(app.deployment.created_at);
  const end = Date.now() + (age < FRESH_DEPLOY_MS ? FRESH_DEPLOY_WAIT_MS : 0);
  for (;;) {
    const version = runner.version(app.project_id, app.app_name);
    if ((version ?? 0) >= app.deployment.version) return true;
    if (signal?.aborted || Date.now() >= end) return version !== undefined;
    await new Promise((resolve) => setTimeout(resolve, FRESH_DEPLOY_POLL_MS));
  }
}

/** Answers every call with NoRunner: a process with no way to other runners. */
const NOWHERE: RunnerClient = {
  invoke: (app) => Promise.reject(noRunner(app)),
  upgrade: (app) => Promise.reject(noRunner(app)),
};

export function noRunner(app: Pick<AppRecord, "project_id" | "app_name">): NoRunner {
  return new NoRunner(`no runner hosts app ${app.project_id}/${app.app_name} right now`);
}

/**
 * The gateway's client: this process's runner (`local`) when it hosts the
 * app, else `remote` (the NATS client; without one, NoRunner).
 */
export function runnerClient({ local, remote }: { local?: HostedRunner; remote?: RunnerClient }): RunnerClient {
  const inProcess = local && new InProcessClient(local);
  const elsewhere = remote ?? NOWHERE;
  const pick = async (app: AppRecord, signal: CallSignal | undefined): Promise<RunnerClient> =>
    local && inProcess && (await hosts(local, app, signal)) ? inProcess : elsewhere;
  // The usual call: this process's runner has the app's version already, decided without a wait.
  const ready = (app: AppRecord) =>
    inProcess !== undefined && (local!.version(app.project_id, app.app_name) ?? 0) >= app.deployment.version;
  return {
    invoke: (app, req) =>
      ready(app) ? inProcess!.invoke(app, req) : pick(app, req.signal).then((c) => c.invoke(app, req)),
    upgrade: (app, req) =>
      ready(app) ? inProcess!.upgrade(app, req) : pick(app, req.signal).then((c) => c.upgrade(app, req)),
  };
}
