// `npx tsx bench/proxy-cost.ts [seconds]`: the bare node:http proxy (tools.ts NODE_PROXY) in front of the echo
// server, loaded by wrk at 32 connections: its req/s and the proxy's CPU per request and heap bytes per request,
// the floor skiff's figures (bench/profile.ts) compare with on the same machine.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { ALLOC_PROBE, ECHO_SERVER, ensureTools, NODE_PROXY, processCost, stop, wrk } from "./tools.js";
import { spawn } from "node:child_process";

const seconds = Number(process.argv[2] ?? 8);
ensureTools();
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-proxy-cost-"));
const allocFile = path.join(tmp, "alloc.json");
const serve = (code: string, env: Record<string, string>, args: string[] = []) => {
  const child = spawn(process.execPath, [...args, "--input-type=module", "-e", code], {
    env: { ...process.env, PORT: "0", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise<{ port: number; child: typeof child }>((resolve, reject) => {
    let out = "";
    child.once("exit", (c) => reject(new Error(`server exited (${c}) before listening`)));
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /port (\d+)/.exec(out);
      if (m) resolve({ port: Number(m[1]), child });
    });
  });
};
const echo = await serve(ECHO_SERVER, {});
const proxy = await serve(NODE_PROXY, { TARGET: String(echo.port), SKIFF_BENCH_ALLOC_FILE: allocFile }, [
  "--import",
  ALLOC_PROBE,
]);
try {
  const job = { url: `http://127.0.0.1:${proxy.port}/echo`, body: '{"a":1,"b":2}', status: 200, connections: 32 };
  await wrk({ ...job, seconds: 2 }, tmp);
  const { result, cpuSeconds, heapBytes } = await processCost(proxy.child.pid!, allocFile, () =>
    wrk({ ...job, seconds }, tmp),
  );
  console.log(
    `bare proxy: ${result.rps} req/s, p50 ${result.p50_ms} ms; CPU ${Math.round((cpuSeconds * 1e6) / result.requests)} µs and heap ${Math.round((heapBytes ?? NaN) / result.requests)} bytes per request`,
  );
} finally {
  await stop(proxy.child);
  await stop(echo.child);
  await rm(tmp, { recursive: true, force: true });
}
