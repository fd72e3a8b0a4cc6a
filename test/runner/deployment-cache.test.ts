import { mkdir, mkdtemp, readdir, rm, utimes } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { DeploymentCache, PRUNE_MIN_AGE_MS } from "../../services/runner/deployment-cache.js";
import { silentLogger } from "../../services/config/logger.js";

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

  it("prune of a folder that does not exist yet removes nothing", async () => {
    const cache = new DeploymentCache(path.join(tmpdir(), "skiff-no-such-folder-" + process.pid), {
      maxBytes: 1024,
      logger: silentLogger,
    });
    expect(await cache.prune(new Set())).toEqual([]);
  });
});
