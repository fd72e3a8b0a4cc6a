// A project's persistent storage as a plain folder (skiff without root, or a
// machine that cannot make a filesystem image): made on first use, shared by
// every call for the project, and removed without following a link or
// opening a FIFO the tenant left in it. The filesystem-image case, which
// needs root, is in test/e2e/persistent-storage.test.ts.
import { execFileSync } from "node:child_process";
import { lstat, mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ProjectStorage } from "../../services/runner/project-storage.js";
import { capturingLogger } from "../helpers/logs.js";

describe("project storage - plain folder", () => {
  let tmp: string;
  beforeEach(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-project-storage-"));
  });
  afterEach(() => rm(tmp, { recursive: true, force: true }));

  it("is made once per project under <dataDir>/storage, says once that it is not bounded, and refuses a bad id", async () => {
    const { logger, lines } = capturingLogger();
    const storage = new ProjectStorage(tmp, 16 * 1024 * 1024, logger, false);
    const [a, again] = (await Promise.all([storage.source("p-one", 1234), storage.source("p-one", 1234)])).map(
      (s) => s.path,
    );
    expect(a).toBe(path.join(tmp, "storage", "p-one"));
    expect(again).toBe(a);
    expect(await storage.source("p-two", 1235)).toEqual({ kind: "folder", path: path.join(tmp, "storage", "p-two") });
    expect(((await stat(a)).mode & 0o777).toString(8)).toBe("700");
    expect(lines.filter((l) => /SKIFF_PROJECT_STORAGE_BYTES is not enforced/.test(l.msg))).toHaveLength(1);
    await expect(storage.source("../etc", 1)).rejects.toThrow(/not a project id/);
  });

  it("removal unlinks a link and a FIFO the tenant left, and touches neither target", async () => {
    const storage = new ProjectStorage(tmp, 16 * 1024 * 1024, capturingLogger().logger, false);
    const folder = (await storage.source("p-one", 1234)).path;
    const bait = path.join(tmp, "bait");
    await mkdir(bait);
    await writeFile(path.join(bait, "keep.txt"), "host file");
    await symlink(bait, path.join(folder, "escape"));
    await symlink(path.join(bait, "keep.txt"), path.join(folder, "file-link"));
    execFileSync("/usr/bin/mkfifo", [path.join(folder, "pipe")]);
    await mkdir(path.join(folder, "sub"));
    await writeFile(path.join(folder, "sub", "data"), "tenant's");
    expect((await lstat(path.join(folder, "pipe"))).isFIFO()).toBe(true);

    await storage.remove("p-one");
    expect(await readdir(path.join(tmp, "storage"))).toEqual([]);
    expect(await readFile(path.join(bait, "keep.txt"), "utf8")).toBe("host file");
    // Used again, it starts empty.
    expect(await readdir((await storage.source("p-one", 1234)).path)).toEqual([]);
  });
});
