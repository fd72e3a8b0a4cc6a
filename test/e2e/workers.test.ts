// SKIFF_WORKERS=2 as `npm start` runs it: a supervisor with the data folder's
// nats-server and two workers on one port. Both workers answer sync and async
// calls, a killed worker is started again and calls go on, no two projects'
// replicas share a uid and a project has one in both workers (read in /proc), and
// SIGTERM stops every worker, their replicas and the nats-server.
import type { ChildProcess } from "node:child_process";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { packApp } from "../../services/apps/bundle.js";
import { bearerAuth } from "../../services/auth/bearer.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { callOnNewConnection, Logs, serves, startWorkersSkiff } from "../helpers/workers-skiff.js";
import { alive } from "../helpers/host-processes.js";

const OTHER = "p-workers2";
/** Starting a worker on a busy 2-core machine takes up to a minute; the supervisor starts them one after another. */
const START_MS = 300_000;

const ECHO_SERVER = [
  "import http from 'node:http';",
  "http.createServer((req, res) => {",
  "  if (req.url === '/health') return res.end('ok');",
  "  const chunks = [];",
  "  req.on('data', (c) => chunks.push(c));",
  "  req.on('end', () => res.end(Buffer.concat(chunks)));",
  "}).listen(Number(process.env.PORT), '127.0.0.1');",
].join("\n");

const echoApp = (name: string) => ({
  "skiff.toml": skiffToml({
    name,
    runtime: { kind: "custom", command: ["node", "server.mjs"], healthcheck: "/health" },
    scaling: { min_replicas: 0, max_replicas: 2, replica_concurrency: 8, cooldown: 600 },
  }),
  "server.mjs": ECHO_SERVER,
});

/** Uid of a live process, from /proc/<pid>/status; undefined once it is gone. */
async function uidOf(pid: number): Promise<number | undefined> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  const m = /^Uid:\s+(\d+)/m.exec(status);
  return m ? Number(m[1]) : undefined;
}

/** The fields of /proc/<pid>/stat after the command: state, ppid, …, start time at [19]; undefined once it is gone. */
async function statFields(pid: number): Promise<string[] | undefined> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  return stat === "" ? undefined : stat.slice(stat.lastIndexOf(")") + 2).split(" ");
}

/** The uids (other than root) of the processes below `pid`: its replicas' sandboxes. */
async function sandboxUids(pid: number): Promise<number[]> {
  const parents = new Map<number, number>();
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const ppid = Number((await statFields(Number(name)))?.[1]);
    if (ppid > 0) parents.set(Number(name), ppid);
  }
  const below = (p: number): boolean => {
    for (let q = parents.get(p); q !== undefined; q = parents.get(q)) if (q === pid) return true;
    return false;
  };
  const uids: number[] = [];
  for (const p of parents.keys()) {
    if (!below(p)) continue;
    const uid = await uidOf(p);
    if (uid !== undefined && uid !== 0) uids.push(uid);
  }
  return uids;
}

describe("SKIFF_WORKERS=2", () => {
  let dataDir: string;
  let tmp: string;
  let child: ChildProcess;
  let logs: Logs;
  let url: string;
  let devToken: string;
  let adminToken: string;

  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), "skiff-workers-apps-"));
    const started = await startWorkersSkiff();
    ({ child, logs, dataDir, url, devToken, adminToken } = started);
    expect((await readFile(join(dataDir, "address"), "utf8")).trim()).toBe(url);
    const admin = started.admin;
    await admin.createProject({ projectId: OTHER, name: "other" });
    for (const [project, name] of [
      ["p-dev", "echo"],
      [OTHER, "echo"],
    ]) {
      const dir = await writeApp(tmp, echoApp(name));
      await admin.deployApp({
        projectId: project,
        bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
      });
    }
  }, START_MS);

  afterAll(async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("exit", resolve));
    }
    await rm(dataDir, { recursive: true, force: true });
    await rm(tmp, { recursive: true, force: true });
  });

  /** Sync calls on fresh connections until both workers have answered; each echoes its body. */
  async function bothWorkersAnswer(project: string, token: string): Promise<void> {
    const seen = new Set<string>();
    for (let i = 0; i < 20 && seen.size < 2; i++) {
      const body = `call ${i} to ${project}`;
      const answer = await callOnNewConnection(`${url}/v4/${project}/echo/x`, token, {
        data: body,
        contentType: "text/plain",
      });
      expect(answer).toMatchObject({ status: 200, body });
      seen.add(String(answer.worker));
    }
    expect([...seen].sort()).toEqual(["1", "2"]);
  }

  it("both workers answer sync calls, each from a replica it started, for every project", async () => {
    await bothWorkersAnswer("p-dev", devToken);
    await bothWorkersAnswer(OTHER, adminToken);
  });

  it("both workers list the runs from one history, which worker 1 projects", async () => {
    // One file in the data folder; none in the workers' folders.
    expect(await readdir(join(dataDir, "history"))).toContain("runs.sqlite");
    for (const n of ["1", "2"]) expect(await readdir(join(dataDir, "workers", n))).not.toContain("history");
    // The sync calls of the test above (answered by both workers): the same runs, whichever worker lists them.
    const byWorker = new Map<string, string>();
    for (let i = 0; i < 40; i++) {
      const page = await callOnNewConnection(`${url}/v2/projects/p-dev/apps/echo/runs?page_size=100`, devToken);
      expect(page.status).toBe(200);
      const ids = (JSON.parse(page.body) as { runs: { runId: string }[] }).runs.map((r) => r.runId);
      byWorker.set(String(page.worker), JSON.stringify(ids.sort()));
      const lists = [...byWorker.values()];
      if (byWorker.size === 2 && lists[0] === lists[1]) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect([...byWorker.keys()].sort()).toEqual(["1", "2"]);
    const [one, two] = [...byWorker.values()].map((l) => JSON.parse(l) as string[]);
    expect(one.length).toBeGreaterThanOrEqual(2);
    expect(two).toEqual(one);
  });

  it("async calls are accepted by either worker and run", async () => {
    const admin = createClient(
      ManagementService,
      createConnectTransport({ baseUrl: url, httpVersion: "1.1", interceptors: [bearerAuth(adminToken)] }),
    );
    const accepted = new Set<string>();
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) {
      const answer = await callOnNewConnection(`${url}/v4/p-dev/echo/x?async=true`, devToken, {
        data: `async ${i}`,
        contentType: "text/plain",
      });
      expect(answer.status).toBe(202);
      accepted.add(String(answer.worker));
      ids.push(JSON.parse(answer.body).run_id);
    }
    expect([...accepted].sort()).toEqual(["1", "2"]);
    for (const runId of ids) {
      let status = "";
      for (let i = 0; i < 100 && status !== "success"; i++) {
        status = await admin.getRun({ projectId: "p-dev", appName: "echo", runId }).then(
          (r) => r.run?.status ?? "",
          () => "",
        );
        if (status !== "success") await new Promise((r) => setTimeout(r, 200));
      }
      expect(status).toBe("success");
    }
  });

  it("no two projects' replicas share a uid, and a project has one uid in both workers (/proc)", async () => {
    const workers = [1, 2].map((n) => Number(logs.lines.findLast(serves(n))!.pid));
    const uids = await Promise.all(workers.map(async (pid) => new Set(await sandboxUids(pid))));
    // Each worker started replicas of both projects (the calls above went to both): two uids in each, the same two.
    for (const set of uids) expect(set.size).toBe(2);
    expect([...uids[0]].sort()).toEqual([...uids[1]].sort());
  });

  it(
    "a killed worker is started again under its number, and calls go on through both",
    async () => {
      const started = logs.lines.findLast((l) => l.msg === "started worker 2")!;
      const pid = Number(started.workerPid);
      expect(alive(pid)).toBe(true);
      const again = logs.next(serves(2));
      process.kill(pid, "SIGKILL");
      const restarted = await again;
      expect(restarted.pid).not.toBe(pid);
      await bothWorkersAnswer("p-dev", devToken);
    },
    START_MS,
  );

  it("SIGTERM stops every worker, their replicas and the nats-server, and the supervisor exits 0", async () => {
    const workers = logs.lines.filter((l) => typeof l.workerPid === "number").map((l) => Number(l.workerPid));
    const natsPid = Number(logs.lines.find((l) => l.msg.startsWith("started nats-server"))?.serverPid);
    expect(natsPid).toBeGreaterThan(0);
    // The workers' children (sandboxes, helpers), each with its start time, which tells it from a later process of its pid.
    const replicas: [number, string][] = [];
    for (const name of (await readdir("/proc")).filter((n) => /^\d+$/.test(n))) {
      const fields = await statFields(Number(name));
      if (fields && workers.includes(Number(fields[1]))) replicas.push([Number(name), fields[19]]);
    }
    expect(replicas.length).toBeGreaterThan(0);
    const exit = new Promise<number | null>((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    expect(await exit).toBe(0);
    expect(workers.filter(alive)).toEqual([]);
    expect(alive(natsPid)).toBe(false);
    // Ended with their worker (bwrap's --die-with-parent): none still runs a moment later.
    const running = async () => {
      const left = [];
      for (const [pid, start] of replicas) {
        const fields = await statFields(pid);
        if (fields && fields[19] === start && fields[0] !== "Z" && fields[0] !== "X") left.push(pid);
      }
      return left;
    };
    for (let i = 0; i < 50 && (await running()).length > 0; i++) await new Promise((r) => setTimeout(r, 100));
    expect(await running()).toEqual([]);
    expect(logs.lines.filter((l) => l.msg === "stopped").map((l) => l.worker ?? "supervisor")).toEqual(
      expect.arrayContaining([1, 2, "supervisor"]),
    );
  });
});
