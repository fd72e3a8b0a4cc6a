// A deploy's steps (the dependency install, the import check) run the
// tenant's code, and skiff reads what they print on the thread that serves
// every caller of the process. A module that prints without end at import
// would hold that thread for the whole import check, and every other
// tenant's call would wait. So a step's output is read at a bounded rate, as
// a replica's is (LOG_BYTES_PER_SECOND), and the step's writes wait on the
// full pipe meanwhile. Here the import prints for four seconds, counting what
// its writes got through, and then fails: with a TypeError when that stayed
// within the rate, a RangeError when it did not (a refusal names the
// exception's type, never its message). A bounded reader lets a few MB a
// second through; an unbounded one, hundreds.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { skiffToml } from "../helpers/apps.js";
import { deploy } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const FLOOD_MS = 4_000;
/** OUTPUT_BYTES_PER_SECOND of prepare.ts (4 MiB) over the flood, with room for the pipe's buffers. */
const BOUND = 4 * 1024 * 1024 * (FLOOD_MS / 1000 + 2);

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
  it("is read at a bounded rate: its writes wait, and what got through stays within the rate", async () => {
    const files = {
      "skiff.toml": skiffToml({ name: "flood", runtime: { kind: "cortex", language: "node", entry: "main.mjs" } }),
      "main.mjs": [
        'import { writeSync } from "node:fs";',
        `const line = "x".repeat(65535) + "\\n";`,
        `const end = Date.now() + ${FLOOD_MS};`,
        "let wrote = 0;",
        "while (Date.now() < end) wrote += writeSync(1, line);",
        `throw new (wrote > 0 && wrote < ${BOUND} ? TypeError : RangeError)();`,
      ].join("\n"),
    };
    const refused = await deploy(tmp, s.management(s.devToken), files).then(
      () => "deployed",
      (err: Error) => err.message,
    );
    expect(refused).toMatch(/cannot load main\.mjs:\s+TypeError: raised while the module was imported/);
  }, 60_000);
});
