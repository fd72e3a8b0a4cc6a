// Real skiff processes for the fault suite: each an ordinary
// `services/main.ts --roles …` child with its own data folder and port
// (chosen once, so a restarted process comes back on the same one), started
// and waited for through /readyz, stopped by SIGTERM or killed by SIGKILL
// together with everything it spawned (its replicas), as a machine dying
// would. Also the load client, the record and event readers, and the counts
// each scenario prints.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import { AckPolicy, DeliverPolicy, nanos, type NatsConnection } from "nats";
import { vi } from "vitest";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import { freePort } from "../../services/nats/cluster-process.js";
import { buckets, streams } from "../../services/nats/layout.js";
import type { RunRecord } from "../../services/runs/store.js";
import { listDeliveries } from "../../services/webhooks/deliveries.js";
import type { Run, WebhookDelivery } from "../../gen/skiff/management/v2/management_pb.js";

export const ROOT = path.resolve(import.meta.dirname, "..", "..");

export interface SkiffProcess {
  readonly name: string;
  readonly url: string;
  readonly dataDir: string;
  readonly alive: boolean;
  /** The child's current pid (0 when not running). */
  readonly pid: number;
  /** Exits seen so far, with their code or signal. */
  readonly exits: string[];
  /** Its last lines on stderr and stdout. */
  readonly tail: string[];
  /** Spawns it and waits until /readyz answers 200. */
  start(): Promise<void>;
  /** SIGKILL to it and every process below it; resolves once it has exited. */
  kill(): Promise<void>;
  /** SIGTERM; resolves with its exit code once it has exited. */
  term(): Promise<number | null>;
}

/** Every pid below `pid` (children, their children…), read from /proc. */
async function descendants(pid: number): Promise<number[]> {
  const parents = new Map<number, number[]>();
  for (const entry of await readdir("/proc").catch(() => [])) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await readFile(`/proc/${entry}/stat`, "utf8").catch(() => "");
    // pid (comm) state ppid …: comm may hold spaces and parentheses, so read after the last ')'.
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (!Number.isFinite(ppid)) continue;
    const list = parents.get(ppid) ?? [];
    list.push(Number(entry));
    parents.set(ppid, list);
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const child of parents.get(p) ?? []) {
      out.push(child);
      walk(child);
    }
  };
  walk(pid);
  return out;
}

export async function spawnSkiff(opts: {
  name: string;
  /** Undefined: every role, as `npm start`. */
  roles?: string;
  dataDir: string;
  env: Record<string, string>;
  readyTimeoutMs?: number;
}): Promise<SkiffProcess> {
  const port = await freePort();
  await mkdir(opts.dataDir, { recursive: true, mode: 0o700 });
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  const exits: string[] = [];
  const tail: string[] = [];
  const keep = (chunk: Buffer) => {
    for (const line of chunk.toString().split("\n")) if (line.trim() !== "") tail.push(line.slice(0, 2000));
    tail.splice(0, Math.max(0, tail.length - 50));
  };
  const url = `http://127.0.0.1:${port}`;
  const proc: SkiffProcess = {
    name: opts.name,
    url,
    dataDir: opts.dataDir,
    exits,
    tail,
    get alive() {
      return child !== undefined && child.exitCode === null && child.signalCode === null;
    },
    get pid() {
      return proc.alive ? child!.pid! : 0;
    },
    async start() {
      if (proc.alive) return;
      const c = spawn(
        process.execPath,
        [path.join(ROOT, "bin", "skiff-server.js"), ...(opts.roles === undefined ? [] : ["--roles", opts.roles])],
        {
          cwd: ROOT,
          env: {
            PATH: process.env.PATH,
            HOME: process.env.HOME,
            SKIFF_PORT: String(port),
            SKIFF_DATA_DIR: opts.dataDir,
            SKIFF_LOG_LEVEL: process.env.FAULTS_LOG_LEVEL ?? "warn",
            ...opts.env,
          },
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      child = c;
      c.stdout!.on("data", keep);
      c.stderr!.on("data", keep);
      exited = new Promise((resolve) =>
        c.once("exit", (code, signal) => {
          exits.push(signal ?? String(code));
          resolve();
        }),
      );
      await vi.waitUntil(
        async () => {
          if (c.exitCode !== null || c.signalCode !== null)
            throw new Error(`${opts.name} exited while starting:\n${tail.join("\n")}`);
          const res = await fetch(`${url}/readyz`).catch(() => undefined);
          return res?.status === 200;
        },
        { timeout: opts.readyTimeoutMs ?? 120_000, interval: 250 },
      );
    },
    async kill() {
      if (!child) return;
      const c = child;
      const below = c.pid === undefined ? [] : await descendants(c.pid);
      c.kill("SIGKILL");
      for (const pid of below) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // gone already
        }
      }
      await exited;
    },
    async term() {
      if (!proc.alive) return child?.exitCode ?? null;
      child!.kill("SIGTERM");
      await exited;
      return child!.exitCode;
    },
  };
  return proc;
}

/** Runs `task` for each of `items` with at most `limit` at once. */
export async function pool<T, R>(items: T[], limit: number, task: (item: T, i: number) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await task(items[i], i);
      }
    }),
  );
  return out;
}

export interface Call {
  /** HTTP status, or 0 when the call got no answer (connection refused or cut). */
  status: number;
  runId?: string;
  error?: string;
  /** The gateway's X-Request-Id, when an answer came. */
  requestId?: string;
  ms: number;
}

/** One POST; a transport failure is status 0 (never thrown). Aborted after `timeoutMs`: a hang is a failure of the test. */
export async function call(url: string, token: string, body: string, timeoutMs = 120_000): Promise<Call> {
  const started = Date.now();
  try {
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body,
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    let json: { run_id?: string } | undefined;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return {
      status: res.status,
      runId: json?.run_id,
      requestId: res.headers.get("x-request-id") ?? undefined,
      ms: Date.now() - started,
      ...(res.status >= 300 ? { error: text.slice(0, 300) } : {}),
    };
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    if ((err as Error).name === "TimeoutError") throw new Error(`${url}: no answer within ${timeoutMs} ms (a hang)`);
    return {
      status: 0,
      error: [cause?.code, cause?.message ?? String(err)].filter(Boolean).join(" "),
      ms: Date.now() - started,
    };
  }
}

/** How many calls got each error that was not an HTTP answer. */
export function transportErrors(calls: Call[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const c of calls) if (c.status === 0) out[c.error!] = (out[c.error!] ?? 0) + 1;
  return out;
}

/** The answers that were not a success, by message. */
export function callErrors(calls: Call[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const c of calls)
    if (c.status >= 400) {
      const key = `${c.status} ${c.error}`;
      out[key] = (out[key] ?? 0) + 1;
    }
  return out;
}

/** Runs that ended in failure, by error type and message. */
export function failureTypes(records: Iterable<RunRecord | undefined>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const r of records)
    if (r?.status === "failure") {
      const key = `${r.error?.type}: ${r.error?.message?.slice(0, 160)}`;
      out[key] = (out[key] ?? 0) + 1;
    }
  return out;
}

/** How many calls got each status. */
export function statuses(calls: Call[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const c of calls) out[c.status] = (out[c.status] ?? 0) + 1;
  return out;
}

/** The management API's GetRun, as the fault tests ask it (a Connect client's method). */
export type GetRun = (req: { projectId: string; appName: string; runId: string }) => Promise<{ run?: Run }>;

/** What the fault tests read of a run the management API answered for: its record's fields they check. */
function recordOfRun(run: Run): RunRecord {
  return {
    run_id: run.runId,
    project_id: run.projectId,
    app_name: run.appName,
    path: run.path,
    async: run.async,
    status: run.status as RunRecord["status"],
    queued_at: "",
    attempts: run.attempts,
    ...(run.error ? { error: { type: run.error.type, message: run.error.message } } : {}),
  };
}

/**
 * The current record of each run (undefined: none): from KV skiff-runs while
 * it is there, else, since a runner purges an ended run's record a minute
 * after it acked the run, as GetRun answers from the run history.
 */
export async function readRecords(
  nc: NatsConnection,
  project: string,
  app: string,
  runIds: string[],
  getRun: GetRun,
): Promise<Map<string, RunRecord | undefined>> {
  const kv = await nc.jetstream().views.kv(buckets.runs.name, { bindOnly: true });
  const out = new Map<string, RunRecord | undefined>();
  await pool(runIds, 32, async (id) => {
    const entry = await kv.get(`${project}.${app}.${id}`);
    if (entry?.operation === "PUT") return void out.set(id, entry.json<RunRecord>());
    const run = await getRun({ projectId: project, appName: app, runId: id })
      .then((r) => r.run)
      .catch(() => undefined);
    out.set(id, run && recordOfRun(run));
  });
  return out;
}

/**
 * A run's first webhook delivery (undefined: none yet): from KV skiff-webhooks
 * while it is there, else from GetRun, which reads the run history's once the
 * delivery is over and its entry purged.
 */
export async function firstDelivery(
  nc: NatsConnection,
  project: string,
  app: string,
  runId: string,
  getRun: GetRun,
): Promise<WebhookDelivery | undefined> {
  const live = (await listDeliveries(nc, runId))[0];
  if (live) return live;
  const run = await getRun({ projectId: project, appName: app, runId })
    .then((r) => r.run)
    .catch(() => undefined);
  return run?.webhookDeliveries[0];
}

/** Waits until every run has a final record; resolves with the records. */
export async function waitFinal(
  nc: NatsConnection,
  project: string,
  app: string,
  runIds: string[],
  timeoutMs: number,
  getRun: GetRun,
): Promise<Map<string, RunRecord | undefined>> {
  let last = new Map<string, RunRecord | undefined>();
  try {
    await vi.waitUntil(
      async () => {
        last = await readRecords(nc, project, app, runIds, getRun);
        return [...last.values()].every(
          (r) => r !== undefined && ["success", "failure", "cancelled"].includes(r.status),
        );
      },
      { timeout: timeoutMs, interval: 1_000 },
    );
  } catch {
    // the caller's assertions say which are not final
  }
  return last;
}

export function byStatus(records: Iterable<RunRecord | undefined>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const r of records) out[r?.status ?? "missing"] = (out[r?.status ?? "missing"] ?? 0) + 1;
  return out;
}

/**
 * Terminal events per run in stream `stream` (SKIFF_EVENTS or SKIFF_WEBHOOKS)
 * under `skiff.….{project}.{app}`: a run that ended once has exactly one.
 */
export async function terminalEvents(
  nc: NatsConnection,
  stream: "events" | "webhooks",
  project: string,
  app: string,
): Promise<Map<string, string[]>> {
  const js = nc.jetstream();
  const jsm = await nc.jetstreamManager();
  const name = stream === "events" ? streams.events.name : streams.webhooks.name;
  const filter =
    stream === "events" ? `skiff.events.runs.${project}.${app}.*` : `skiff.webhooks.runs.${project}.${app}`;
  const info = await jsm.streams.info(name, { subjects_filter: filter });
  const total = Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0);
  const out = new Map<string, string[]>();
  if (total === 0) return out;
  // An ephemeral consumer without acks, one copy in memory.
  const ci = await jsm.consumers.add(name, {
    filter_subject: filter,
    deliver_policy: DeliverPolicy.All,
    ack_policy: AckPolicy.None,
    mem_storage: true,
    num_replicas: 1,
    inactive_threshold: nanos(60_000),
  });
  const consumer = await js.consumers.get(name, ci.name);
  const messages = await consumer.consume();
  let seen = 0;
  for await (const m of messages) {
    const event = fromBinary(RunEventSchema, m.data);
    const status = m.subject.split(".").pop()!;
    if (stream === "webhooks" || ["success", "failure", "cancelled"].includes(status)) {
      const list = out.get(event.runId) ?? [];
      list.push(stream === "webhooks" ? "webhook" : status);
      out.set(event.runId, list);
    }
    if (++seen >= total) break;
  }
  messages.stop();
  await jsm.consumers.delete(name, ci.name).catch(() => undefined);
  return out;
}

/** Prints a scenario's counts, one block the suite's output can be read for. */
export function report(scenario: string, counts: Record<string, unknown>): void {
  console.log(`\n[faults] ${scenario}\n${JSON.stringify(counts, null, 2)}\n`);
}
