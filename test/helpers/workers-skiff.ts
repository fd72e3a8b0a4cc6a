// skiff with SKIFF_WORKERS=2 as `npm start` runs it (bin/skiff-server.js):
// a supervisor and two workers in processes of their own, on a data folder
// and free port of their own, their log lines read as they come.
import { spawn, type ChildProcess } from "node:child_process";
import http from "node:http";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../../services/auth/bearer.js";
import { SKIFF_SERVER, TEST_ROOT } from "./paths.js";

export type LogLine = Record<string, unknown> & { msg: string };

/** The supervisor's and its workers' log lines (they share its stdout), as they come. */
export class Logs {
  readonly lines: LogLine[] = [];
  private waiters: { match: (l: LogLine) => boolean; resolve: (l: LogLine) => void }[] = [];
  constructor(child: ChildProcess) {
    createInterface({ input: child.stdout! }).on("line", (text) => {
      let line: LogLine;
      try {
        line = JSON.parse(text);
      } catch {
        return;
      }
      this.lines.push(line);
      // Errors show in the test's output, for a failure to be read.
      if (Number(line.level) >= 50) console.error(text);
      this.waiters = this.waiters.filter((w) => (w.match(line) ? (w.resolve(line), false) : true));
    });
  }
  /** The first line from now on (or already seen, when `seen` is true) that matches. */
  next(match: (l: LogLine) => boolean, seen = false): Promise<LogLine> {
    const found = seen ? this.lines.find(match) : undefined;
    if (found) return Promise.resolve(found);
    return new Promise((resolve) => this.waiters.push({ match, resolve }));
  }
}

/** A worker's line saying it serves. */
export const serves = (worker: number) => (l: LogLine) => l.worker === worker && l.msg.startsWith("skiff serves");

export interface WorkersSkiff {
  child: ChildProcess;
  logs: Logs;
  dataDir: string;
  url: string;
  devToken: string;
  adminToken: string;
  admin: Client<typeof ManagementService>;
}

/** Starts it with these settings on top (SKIFF_NATS_URL unset: the supervisor starts the data folder's nats-server). */
export async function startWorkersSkiff(env: Record<string, string> = {}): Promise<WorkersSkiff> {
  const dataDir = await mkdtemp(join(tmpdir(), "skiff-workers-"));
  const child = spawn(process.execPath, [SKIFF_SERVER], {
    cwd: join(TEST_ROOT, ".."),
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      CI: "1",
      SKIFF_WORKERS: "2",
      SKIFF_PORT: "0",
      SKIFF_DATA_DIR: dataDir,
      ...env,
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const logs = new Logs(child);
  const ready = await Promise.race([
    Promise.all([logs.next(serves(1), true), logs.next(serves(2), true)]),
    new Promise<never>((_, reject) => child.once("exit", (code) => reject(new Error(`skiff exited with ${code}`)))),
  ]);
  const url = String(ready[0].url);
  if (ready[1].url !== url) throw new Error(`the workers serve ${url} and ${String(ready[1].url)}`);
  const adminToken = (await readFile(join(dataDir, "admin-token"), "utf8")).trim();
  return {
    child,
    logs,
    dataDir,
    url,
    devToken: (await readFile(join(dataDir, "dev-token"), "utf8")).trim(),
    adminToken,
    admin: createClient(
      ManagementService,
      createConnectTransport({ baseUrl: url, httpVersion: "1.1", interceptors: [bearerAuth(adminToken)] }),
    ),
  };
}

/**
 * Stops it as its operator would (SIGTERM, SIGKILL after 30 s if it is still
 * there) and removes its data folder; nothing for a skiff never started.
 */
export async function stopWorkersSkiff(skiff: Pick<WorkersSkiff, "child" | "dataDir"> | undefined): Promise<void> {
  if (!skiff) return;
  const { child } = skiff;
  if (child.exitCode === null && child.signalCode === null) {
    const exit = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
    await exit;
    clearTimeout(timer);
  }
  await rm(skiff.dataDir, { recursive: true, force: true });
}

export interface FreshAnswer {
  status: number;
  /** Its Skiff-Worker header: the worker that answered (absent from a skiff of one process). */
  worker: string | undefined;
  body: string;
}

/**
 * A call on a connection of its own (no agent), so that the supervisor hands it to the next worker: a GET, or a
 * POST of `body` when one is given.
 */
export function callOnNewConnection(
  url: string,
  token: string,
  body?: { data: string; contentType: string },
): Promise<FreshAnswer> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, {
      method: body === undefined ? "GET" : "POST",
      agent: false,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body === undefined ? {} : { "content-type": body.contentType }),
      },
    });
    req.on("error", reject);
    req.on("response", (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const worker = res.headers["skiff-worker"];
        resolve({
          status: res.statusCode!,
          worker: Array.isArray(worker) ? worker.join(", ") : worker,
          body: Buffer.concat(chunks).toString(),
        });
      });
    });
    req.end(body?.data);
  });
}
