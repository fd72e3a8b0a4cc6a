import { mkdir, mkdtemp, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { DeploymentCache, PRUNE_MIN_AGE_MS } from "../../services/runner/deployment-cache.js";
import { silentLogger } from "../../services/config/logger.js";
import { packApp, sha256 } from "../../services/apps/index.js";
import { skiffToml } from "../helpers/apps.js";

describe("deployment cache", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  it("prune removes the old folders of bundles no app lists, and nothing else", async () => {
    const root = await mkdtemp(path.join(tmpdir(), "skiff-deployments-"));
    dirs.push(root);
    const digest = (c: string) => c.repeat(64);
    const now = Date.now();
    const old = new Date(now - PRUNE_MIN_AGE_MS - 60_000);
    const folders: [string, Date | undefined][] = [
      [digest("a"), old], // listed by an app: kept
      [digest("b"), old], // listed by none, old: removed
      [digest("c"), undefined], // listed by none, just made (a deploy may be preparing it): kept
      [".staging-0123456789abcdef-00ff00ff", old], // an interrupted preparation: removed
      ["notes", old], // not ours: kept
    ];
    for (const [name, mtime] of folders) {
      await mkdir(path.join(root, name, ".skiff"), { recursive: true });
      if (mtime) await utimes(path.join(root, name), mtime, mtime);
    }
    const cache = new DeploymentCache(root, { maxBytes: 1024, logger: silentLogger });
    expect(await cache.prune(new Set([digest("a")]), now)).toEqual([digest("b")]);
    expect((await readdir(root)).sort()).toEqual([digest("a"), digest("c"), "notes"].sort());
  });

  it("a bundle whose build gets secrets is prepared per project and per value; a build of replaced values is pruned", async () => {
    const root = await mkdtemp(path.join(tmpdir(), "skiff-deployments-"));
    const app = await mkdtemp(path.join(tmpdir(), "skiff-deployments-app-"));
    dirs.push(root, app);
    await writeFile(
      path.join(app, "skiff.toml"),
      skiffToml({ name: "web", runtime: { kind: "custom", command: ["node", "server.js"] } }) +
        '\n[build]\nsecrets = ["TOKEN"]\n',
    );
    await writeFile(path.join(app, "server.js"), "");
    const bytes = (await packApp(app)).bytes;
    const digest = sha256(bytes);
    const env: Record<string, Record<string, string>> = { "p-a": { TOKEN: "1", OTHER: "x" }, "p-b": {} };
    const cache = new DeploymentCache(root, { maxBytes: 1 << 20, logger: silentLogger });
    cache.projectEnv = (project) => env[project] ?? {};
    const get = async (project: string) => path.basename((await cache.get(digest, async () => bytes, project)).dir);

    const a1 = await get("p-a");
    const b = await get("p-b");
    expect(a1).toMatch(new RegExp(`^${digest}-p-a-[0-9a-f]{16}$`));
    expect(b).toMatch(new RegExp(`^${digest}-p-b-[0-9a-f]{16}$`));
    expect(await get("p-a")).toBe(a1); // the same values: the same build
    env["p-a"].OTHER = "y"; // a secret the build does not get: the same build
    expect(await get("p-a")).toBe(a1);
    env["p-a"].TOKEN = "2";
    const a2 = await get("p-a");
    expect(a2).not.toBe(a1);
    // The digest's own folder is the stub that says so.
    expect((await readdir(root)).sort()).toEqual([digest, a1, a2, b].sort());
    expect(await cache.prune(new Set([digest]))).toEqual([a1]);
    expect((await cache.prune(new Set())).sort()).toEqual([digest, a2, b].sort());
  });

  it("prune of a folder that does not exist yet removes nothing", async () => {
    const cache = new DeploymentCache(path.join(tmpdir(), "skiff-no-such-folder-" + process.pid), {
      maxBytes: 1024,
      logger: silentLogger,
    });
    expect(await cache.prune(new Set())).toEqual([]);
  });
});
