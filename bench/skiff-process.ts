// skiff as the benchmarks see it: `bin/skiff-server.js` (as `npm start` runs it) in its own process, on
// its own NATS server and data folder, exactly as `npm start` runs it, so
// that its CPU and memory are its own and not the load generator's.
// BENCH_STDOUT=file appends every such process's standard output (its log, and
// what node prints there, a --trace-gc-nvp trace given by PROFILE_NODE_ARGS say) to file.
import { spawn, type ChildProcess } from "node:child_process";
import { appendFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { SERVER_NODE_FLAGS } from "../bin/server-flags.js";
import { stop } from "./tools.js";

const ROOT = path.resolve(import.meta.dirname, "..");

export interface SkiffProcess {
  url: string;
  pid: number;
  adminToken: string;
  devToken: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

export async function startSkiffProcess(opts: {
  natsUrl: string;
  dataDir: string;
  env?: Record<string, string>;
  roles?: string;
  /** Options for node itself, e.g. --cpu-prof. */
  nodeArgs?: string[];
}): Promise<SkiffProcess> {
  const child = spawn(
    process.execPath,
    [
      ...SERVER_NODE_FLAGS,
      ...(opts.nodeArgs ?? []),
      "bin/skiff-server.js",
      ...(opts.roles ? ["--roles", opts.roles] : []),
    ],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        SKIFF_PORT: "0",
        SKIFF_DATA_DIR: opts.dataDir,
        SKIFF_NATS_URL: opts.natsUrl,
        SKIFF_LOG_LEVEL: "info",
        CI: "1",
        ...opts.env,
      },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.once("exit", (code) => reject(new Error(`skiff exited (${code}) before serving:\n${out.slice(-2000)}`)));
    child.stdout!.on("data", (d: Buffer) => {
      if (process.env.BENCH_STDOUT) appendFileSync(process.env.BENCH_STDOUT, d);
      out += d.toString();
      const m = /"msg":"skiff serves (http:\/\/[^ "]+)/.exec(out);
      if (m) {
        resolve(m[1]);
        out = "";
      } else if (out.length > 1_000_000) out = out.slice(-100_000);
    });
  });
  const token = (name: string) => readFile(path.join(opts.dataDir, name), "utf8").then((t) => t.trim());
  return {
    url,
    pid: child.pid!,
    adminToken: opts.env?.SKIFF_ADMIN_TOKEN ?? (await token("admin-token")),
    devToken: opts.roles && !opts.roles.includes("management") ? "" : await token("dev-token"),
    child,
    stop: () => stop(child),
  };
}

/**
 * Waits until the run history answers (ListRuns): a fresh data folder makes
 * its embedded database first, a few seconds of one core that would
 * otherwise fall inside the first measurement.
 */
export async function waitRunHistory(skiff: { url: string; devToken: string }, app: string): Promise<void> {
  for (;;) {
    const res = await fetch(`${skiff.url}/v2/projects/p-dev/apps/${app}/runs?page_size=1`, {
      headers: { authorization: `Bearer ${skiff.devToken}` },
    });
    await res.arrayBuffer();
    if (res.status === 200) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
