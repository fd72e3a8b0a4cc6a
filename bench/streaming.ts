// Time to first byte of a streamed answer: examples/stream-events' /ticks
// (server-sent events, one every TICK_MS) called directly and through skiff,
// from sending the request to the first chunk and to the end. Through skiff
// the first event should come as soon as the app writes it, not when the
// answer ends: ttfb well under total.
import { spawn } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { deployFolder } from "./deploy.js";
import type { SkiffProcess } from "./skiff-process.js";
import { freePort, percentile, round, stop } from "./tools.js";

const APP_DIR = path.resolve(import.meta.dirname, "..", "examples", "stream-events");
const TICKS = 5;
const TICK_MS = 50;

export interface StreamTimes {
  ttfb_ms: number;
  total_ms: number;
}

/** One call: ms to the first chunk and to the end. */
async function once(url: string, headers: Record<string, string>): Promise<StreamTimes> {
  const started = performance.now();
  const res = await fetch(url, { method: "POST", headers });
  if (res.status !== 200) throw new Error(`${url} answered ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader();
  let ttfb = 0;
  for (let next = await reader.read(); !next.done; next = await reader.read()) {
    if (ttfb === 0) ttfb = performance.now() - started;
  }
  return { ttfb_ms: ttfb, total_ms: performance.now() - started };
}

async function series(url: string, headers: Record<string, string>, rounds: number): Promise<StreamTimes> {
  await once(url, headers); // warm-up
  const all: StreamTimes[] = [];
  for (let i = 0; i < rounds; i++) all.push(await once(url, headers));
  return {
    ttfb_ms: round(
      percentile(
        all.map((t) => t.ttfb_ms),
        0.5,
      ),
      3,
    ),
    total_ms: round(
      percentile(
        all.map((t) => t.total_ms),
        0.5,
      ),
      1,
    ),
  };
}

export async function streamedAnswers(
  skiff: SkiffProcess,
  tmp: string,
  rounds: number,
): Promise<{ direct: StreamTimes; skiff: StreamTimes; app_ms: number }> {
  const files: Record<string, string> = {};
  for (const name of await readdir(APP_DIR)) files[name] = await readFile(path.join(APP_DIR, name), "utf8");
  await deployFolder(skiff, tmp, files);
  const port = await freePort();
  const child = spawn(process.execPath, [path.join(APP_DIR, "server.mjs")], {
    env: { ...process.env, PORT: String(port) },
    stdio: "ignore",
  });
  try {
    const query = `ticks?n=${TICKS}&ms=${TICK_MS}`;
    const auth = { Authorization: `Bearer ${skiff.devToken}` };
    // The app answers once it is up (the first call through skiff waits for the fresh deployment).
    for (const url of [`http://127.0.0.1:${port}/health`, `${skiff.url}/v4/p-dev/stream-events/health`]) {
      for (let tries = 0; ; tries++) {
        const ok = await fetch(url, { method: "POST", headers: auth }).then(
          (r) => r.ok,
          () => false,
        );
        if (ok) break;
        if (tries > 300) throw new Error(`${url} never answered`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    return {
      direct: await series(`http://127.0.0.1:${port}/${query}`, {}, rounds),
      skiff: await series(`${skiff.url}/v4/p-dev/stream-events/${query}`, auth, rounds),
      app_ms: (TICKS - 1) * TICK_MS,
    };
  } finally {
    await stop(child);
  }
}
