// What a new user sees of an app from the outside: a Cortex generator's
// streamed answer carries skiff's headers and none of the shim's (no
// `server: BaseHTTP/… Python/…`, no Date of its own), and deleting an app
// removes its durable consumer on SKIFF_RUNS, which a runner does not make
// again.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { consumers } from "../../services/nats/layout.js";
import { skiffToml } from "../helpers/apps.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

let t: TestSkiff;
let tmp: string;

const PYTHON = ["def count(n):", "    for i in range(n):", "        yield {'i': i}", "def one():", "    return 1"];
const NODE = [
  "export function* count({ n }) { for (let i = 0; i < n; i++) yield { i }; }",
  "export const one = () => 1;",
];

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-lifecycle-"));
  t = await startTestSkiff();
  const scaling = { max_replicas: 1 };
  await deploy(tmp, t.management(), {
    "skiff.toml": skiffToml({
      name: "gen-py",
      runtime: { kind: "cortex", language: "python", entry: "main.py" },
      scaling,
    }),
    "main.py": PYTHON.join("\n"),
  });
  await deploy(tmp, t.management(), {
    "skiff.toml": skiffToml({
      name: "gen-node",
      runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
      scaling,
    }),
    "index.mjs": NODE.join("\n"),
  });
  await deploy(tmp, t.management(), cortexApp("doomed", { max_replicas: 1 }));
  await vi.waitUntil(() => ["gen-py", "gen-node", "doomed"].every((a) => t.skiff.runner!.version(P, a) === 1), {
    timeout: 60_000,
  });
}, 90_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("a Cortex generator's streamed answer", () => {
  /** Headers a streamed answer may carry besides those of a whole answer from the same skiff. */
  const STREAM_ONLY = new Set(["cache-control", "transfer-encoding"]);

  it.each(["gen-py", "gen-node"])("%s: carries skiff's headers and none of the shim's", async (app) => {
    const whole = await post(`${t.url}/v4/${P}/${app}/one`, t.devToken, "{}");
    expect(whole.status).toBe(200);
    const streamed = await post(`${t.url}/v4/${P}/${app}/count`, t.devToken, '{"n":3}', {
      accept: "text/event-stream",
    });
    expect(streamed.status).toBe(200);
    expect(streamed.headers.get("content-type")).toMatch(/^text\/event-stream/);
    expect(streamed.text).toContain('data: {"i":2}');
    expect(streamed.headers.get("server")).toBeNull();
    const extra = [...streamed.headers.keys()].filter((name) => !whole.headers.has(name) && !STREAM_ONLY.has(name));
    expect(extra).toEqual([]);
    // The Date is skiff's own: one, well formed, now.
    expect(Math.abs(Date.parse(streamed.headers.get("date")!) - Date.now())).toBeLessThan(5_000);
  });
});

describe("deleting an app", () => {
  it("removes its durable consumer on SKIFF_RUNS, and no runner makes it again", async () => {
    const jsm = await t.skiff.nats.nc.jetstreamManager();
    const spec = consumers.runQueue(P, "doomed");
    const accepted = await post(`${t.url}/v4/${P}/doomed/add?async=true`, t.devToken, '{"a":1,"b":2}');
    expect(accepted.status).toBe(202);
    await vi.waitUntil(
      () =>
        jsm.consumers.info(spec.stream, spec.name).then(
          () => true,
          () => false,
        ),
      {
        timeout: 30_000,
      },
    );

    await t.management().deleteApp({ projectId: P, appName: "doomed" });
    await vi.waitUntil(() => t.skiff.runner!.version(P, "doomed") === undefined, { timeout: 30_000 });
    // Longer than a runner's pause before it pulls again after an error.
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    const names = [];
    for await (const c of jsm.consumers.list(spec.stream)) names.push(c.name);
    expect(names).not.toContain(spec.name);
  });
});
