// A deploy's steps (the dependency install, the import check) run the
// tenant's code, and skiff reads what they print on the thread that serves
// every caller of the process. A module that prints without end at import
// would hold that thread for the whole import check, and every other
// tenant's call would wait. So a step's output is read at a bounded rate, as
// a replica's is (LOG_BYTES_PER_SECOND), and the tail kept of it is not
// copied at every chunk. Here the import prints for four seconds; skiff's
// thread (this test process's) is busy for far less than that.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { skiffToml } from "../helpers/apps.js";
import { deploy } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const FLOOD_MS = 4_000;

let s: TestSkiff;
let tmp: string;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-build-flood-"));
  s = await startTestSkiff();
}, 60_000);

afterAll(async () => {
  await s?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe("a deploy step that prints without end", () => {
  it("costs skiff's thread little: its output is read at a bounded rate", async () => {
    const files = {
      "skiff.toml": skiffToml({ name: "flood", runtime: { kind: "cortex", language: "node", entry: "main.mjs" } }),
      "main.mjs": [
        'import { writeSync } from "node:fs";',
        `const line = "x".repeat(65535) + "\\n";`,
        `const end = Date.now() + ${FLOOD_MS};`,
        "while (Date.now() < end) writeSync(1, line);",
        "export function hi() { return 1; }",
      ].join("\n"),
    };
    const before = performance.eventLoopUtilization();
    const started = performance.now();
    await deploy(tmp, s.management(s.devToken), files);
    const elapsed = performance.now() - started;
    const busyMs = performance.eventLoopUtilization(before).active;
    expect(elapsed).toBeGreaterThan(FLOOD_MS);
    expect(busyMs, `skiff's thread was busy ${Math.round(busyMs)} of ${Math.round(elapsed)} ms`).toBeLessThan(
      FLOOD_MS / 2,
    );
  }, 60_000);
});
