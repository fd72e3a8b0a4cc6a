// bin/skiff.js and bin/skiff-server.js: the CLI and the server run from one
// bundled file each (bin/bundle.js), made on first use and again when a file
// it holds changes.
import { readFile, stat, utimes, writeFile } from "node:fs/promises";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { SERVER_NODE_FLAGS } from "../../bin/server-flags.js";
import { runCli } from "../helpers/cli.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const BUNDLE = path.join(ROOT, "node_modules/.cache/skiff/cli.mjs");
const INPUTS = path.join(ROOT, "node_modules/.cache/skiff/cli.inputs.json");

/** What a bundle's record says: the checkout it was made in, and each source's modification time and size. */
interface Recorded {
  root: string;
  files: Record<string, string>;
}
const recordOf = async (file: string) => JSON.parse(await readFile(file, "utf8")) as Recorded;

describe("bin/skiff.js", () => {
  it("runs the CLI from its bundle, which holds the CLI's sources and no server code, and is made again when one changes", async () => {
    expect(await runCli(["--help"])).toMatchObject({ code: 0, stdout: expect.stringContaining("skiff") });
    const inputs = Object.keys((await recordOf(INPUTS)).files);
    expect(inputs).toContain("services/cli/main.ts");
    expect(inputs.filter((f) => /^services\/(server|runner|nats|invocation|management|webhook)\//.test(f))).toEqual([]);

    const before = (await stat(BUNDLE)).mtimeMs;
    const source = path.join(ROOT, "services/cli/table.ts");
    const later = new Date(Date.now() + 2000);
    await utimes(source, later, later);
    expect(await runCli(["--help"])).toMatchObject({ code: 0 });
    const recorded = await recordOf(INPUTS);
    const now = await stat(source);
    expect(recorded.files["services/cli/table.ts"]).toBe(`${now.mtimeMs}:${now.size}`);
    expect((await stat(BUNDLE)).mtimeMs).toBeGreaterThan(before);
  });

  it("is made again in a copy of the checkout, whose files keep their times and sizes: a bundle names its sources' places", async () => {
    expect(await runCli(["--help"])).toMatchObject({ code: 0 });
    // As `cp -a` of a checkout leaves it: every source as recorded, the record the original checkout's.
    const copied = await recordOf(INPUTS);
    await writeFile(INPUTS, JSON.stringify({ ...copied, root: "/elsewhere/skiff/" }));
    const before = (await stat(BUNDLE)).mtimeMs;
    expect(await runCli(["--help"])).toMatchObject({ code: 0 });
    expect((await recordOf(INPUTS)).root).toBe(copied.root);
    expect((await stat(BUNDLE)).mtimeMs).toBeGreaterThan(before);
  });
});

describe("bin/skiff-server.js", () => {
  it("runs the server from its bundle, in which every module keeps its own place: files beside a module are found from services/", async () => {
    // Made by the test run's global setup, as `npm start` makes it on its first start.
    const bundle = await readFile(path.join(ROOT, "node_modules/.cache/skiff/server.mjs"), "utf8");
    const inputs = Object.keys((await recordOf(path.join(ROOT, "node_modules/.cache/skiff/server.inputs.json"))).files);
    expect(inputs).toEqual(expect.arrayContaining(["services/main.ts", "services/runner/sandbox-argv.ts"]));
    // The bundle's own import.meta would point every module at node_modules/.cache/skiff/.
    expect(bundle).not.toMatch(/import\.meta\.(url|dirname|filename)/);
    // netns-connect.ts finds its helper script beside it: `path.join(import.meta.dirname, "netns-connect.py")`.
    expect(bundle).toMatch(`.join(${JSON.stringify(path.join(ROOT, "services", "runner"))}, "netns-connect.py")`);
  });
});

describe("bin/server-flags.js", () => {
  it("npm start, the systemd unit and the manifests of docs/deploy.md start the server with Node's options of the server", async () => {
    const start = `node ${SERVER_NODE_FLAGS.join(" ")} bin/skiff-server.js`;
    const pkg = JSON.parse(await readFile(path.join(ROOT, "package.json"), "utf8")) as { scripts: { start: string } };
    expect(pkg.scripts.start).toBe(start);
    const deploy = await readFile(path.join(ROOT, "docs/deploy.md"), "utf8");
    expect(deploy).toContain(`ExecStart=/usr/bin/${start}`);
    expect(deploy).toContain(`started with \`${start}\``);
    expect(deploy).not.toMatch(/node bin\/skiff-server\.js/);
  });
});
