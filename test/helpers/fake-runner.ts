// A runner of our own making, for the runner client's tests: it implements
// HostedRunner (the interface the runner role hands the runner client) with
// apps that answer by path, and records what it was asked. No replicas, no
// processes: what it answers is what the tests check came through.
import { PassThrough } from "node:stream";
import { parseAppConfig, type AppRecord, type DeploymentRecord } from "../../services/apps/index.js";
import type { HostedRunner, UpgradeAnswer, UpgradeRequest } from "../../services/runner-client/index.js";
import {
  AppNotFound,
  Cancelled,
  Overloaded,
  ReplicaCrashed,
  RunTimeout,
  type AnswerStream,
  type InvokeRequest,
  type InvokeResponse,
  type StreamEnd,
} from "../../services/runs/index.js";

export const PROJECT = "p-fake";

/** An app record as the registry holds it: a Custom app (or Cortex, with `functions`) at `version`. */
export function appRecord(
  name: string,
  opts: { version?: number; cortex?: string[]; grace?: number; createdAt?: string } = {},
): AppRecord {
  const runtime = opts.cortex
    ? `kind = "cortex"\nlanguage = "python"\nentry = "main.py"`
    : `kind = "custom"\ncommand = ["app"]`;
  const config = parseAppConfig(
    `[app]\nname = "${name}"\n[runtime]\n${runtime}\n[scaling]\nresponse_grace_period = ${opts.grace ?? 30}\n`,
  );
  const deployment: DeploymentRecord = {
    version: opts.version ?? 1,
    created_at: opts.createdAt ?? "2020-01-01T00:00:00.000Z",
    bundle_bytes: 10,
    digest: "d".repeat(64),
    created_by: "admin",
    object: `bundles/${name}`,
  };
  return {
    project_id: PROJECT,
    app_name: name,
    config,
    deployment,
    deployments: [deployment],
    ...(opts.cortex ? { functions: opts.cortex } : {}),
    created_at: deployment.created_at,
    updated_at: deployment.created_at,
  };
}

const encoder = new TextEncoder();

/** A streamed answer of `chunks`, produced as read; `produced` counts them, `cancelled` says whether it was stopped. */
export function streamedAnswer(
  chunks: () => AsyncIterable<Uint8Array>,
  end: StreamEnd = { runTimeMs: 7 },
): { stream: AnswerStream; produced: { chunks: number; bytes: number }; cancelled: Promise<void> } {
  const produced = { chunks: 0, bytes: 0 };
  let resolveEnd!: (end: StreamEnd) => void;
  let rejectEnd!: (err: Error) => void;
  const ended = new Promise<StreamEnd>((resolve, reject) => ([resolveEnd, rejectEnd] = [resolve, reject]));
  ended.catch(() => undefined);
  let cancel!: () => void;
  const cancelled = new Promise<void>((resolve) => (cancel = resolve));
  let stopped = false;
  async function* gen(): AsyncGenerator<Uint8Array> {
    let done = false;
    try {
      for await (const chunk of chunks()) {
        if (stopped) return;
        produced.chunks++;
        produced.bytes += chunk.byteLength;
        yield chunk;
      }
      done = true;
      resolveEnd(end);
    } catch (err) {
      done = true;
      rejectEnd(err as Error);
      throw err;
    } finally {
      if (!done) {
        stopped = true;
        rejectEnd(new Cancelled());
        cancel();
      }
    }
  }
  return {
    stream: {
      chunks: gen(),
      cancel: () => {
        stopped = true;
        rejectEnd(new Cancelled());
        cancel();
      },
      ended,
    },
    produced,
    cancelled,
  };
}

type Handler = (req: InvokeRequest) => Promise<InvokeResponse>;

/**
 * The fake runner: hosts the apps given to host() at their version; each
 * app's calls go to the handler of their path (`on`). Upgrades answer with
 * an echo connection (what the caller writes comes back) on "/echo", else a
 * refusal.
 */
export class FakeRunner implements HostedRunner {
  readonly calls: InvokeRequest[] = [];
  readonly upgrades: UpgradeRequest[] = [];
  private readonly versions = new Map<string, number>();
  private readonly handlers = new Map<string, Handler>();

  host(app: string, version = 1): this {
    this.versions.set(app, version);
    return this;
  }

  drop(app: string): void {
    this.versions.delete(app);
  }

  on(path: string, handler: Handler): this {
    this.handlers.set(path, handler);
    return this;
  }

  version(_projectId: string, appName: string): number | undefined {
    return this.versions.get(appName);
  }

  async invoke(projectId: string, appName: string, req: InvokeRequest): Promise<InvokeResponse> {
    if (!this.versions.has(appName)) throw new AppNotFound(projectId, appName);
    this.calls.push(req);
    const handler = this.handlers.get(req.path);
    if (!handler) return answer(404, `no route ${req.path}`);
    return handler(req);
  }

  async upgrade(projectId: string, appName: string, req: UpgradeRequest): Promise<UpgradeAnswer> {
    if (!this.versions.has(appName)) throw new AppNotFound(projectId, appName);
    this.upgrades.push(req);
    if (req.path !== "/echo")
      return { kind: "answered", status: 403, headers: { "x-app": "fake" }, body: Buffer.from("no"), replicaId: "r1" };
    return {
      kind: "upgraded",
      status: 101,
      headers: { upgrade: "websocket", "sec-websocket-accept": "yes" },
      socket: new PassThrough(),
      head: Buffer.from("hello"),
      replicaId: "r1",
      replicaExited: () => new Promise<void>(() => {}),
    };
  }
}

/** A whole answer. */
export function answer(
  status: number,
  body: string | Uint8Array,
  headers: Record<string, string> = {},
): InvokeResponse {
  return {
    status,
    headers: { "content-type": "text/plain", ...headers },
    body: typeof body === "string" ? encoder.encode(body) : body,
    runTimeMs: 3,
    replicaId: "r1",
  };
}

/** The runner errors a fake app throws by name. */
export const ERRORS = {
  overloaded: () => new Overloaded("every replica is busy", 2),
  timeout: () => new RunTimeout(30),
  crashed: () => new ReplicaCrashed("the replica exited"),
};
