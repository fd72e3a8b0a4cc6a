// Persistent storage: a project's replicas share /persistent-storage, which
// outlives a redeploy; another project's replicas see a folder of their own;
// a write past SKIFF_PROJECT_STORAGE_BYTES fails in the writer with ENOSPC;
// links and FIFOs a tenant leaves there are never followed by skiff, which
// lets go of the storage's device at its stop and removes it (with its
// project, or by itself) with no walk of its files; nothing of it is mounted
// outside the sandboxes.
import { execFileSync } from "node:child_process";
import { lstat, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { silentLogger } from "../../services/config/logger.js";
import { ProjectStorage } from "../../services/runner/project-storage.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { machineCan } from "../helpers/machine.js";
import { post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const QUOTA = 16 * 1024 * 1024;

/** The loop devices attached to a file. */
function loopsOf(file: string): string[] {
  return execFileSync("/usr/sbin/losetup", ["-j", file], { encoding: "utf8" }).split("\n").filter(Boolean);
}

const MAIN = `import os

ROOT = "/persistent-storage"


def write(name: str, text: str):
    with open(os.path.join(ROOT, name), "w") as f:
        f.write(text)
    return "written"


def read(name: str):
    try:
        with open(os.path.join(ROOT, name)) as f:
            return f.read()
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def fill():
    chunk = b"x" * (1024 * 1024)
    written = 0
    try:
        for i in range(1000):
            with open(os.path.join(ROOT, f"fill-{i}"), "wb") as f:
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            written += 1
    except OSError as e:
        return {"written_mib": written, "error": f"{type(e).__name__}: {e}"}
    return {"written_mib": written, "error": None}


def clear():
    for name in os.listdir(ROOT):
        if name.startswith("fill-"):
            os.remove(os.path.join(ROOT, name))
    return "cleared"


def plant(target: str):
    os.symlink(target, os.path.join(ROOT, "escape"))
    os.mkfifo(os.path.join(ROOT, "pipe"))
    return sorted(os.listdir(ROOT))
`;

const isRoot = process.getuid?.() === 0;

describe.skipIf(!machineCan("persistent storage tests", isRoot ? undefined : "they need root (a loop mount)"))(
  "persistent storage",
  () => {
    let t: TestSkiff;
    let tmp: string;
    let token: string;

    const deploy = async (project: string, version: string) => {
      const dir = await writeApp(tmp, {
        "skiff.toml": skiffToml({ name: "disk", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
        "main.py": `${MAIN}\nVERSION = "${version}"\n`,
      });
      await t.management().deployApp({
        projectId: project,
        bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
      });
    };
    const call = async (project: string, fn: string, body: unknown = {}) => {
      const a = await post(`${t.url}/v4/${project}/disk/${fn}`, token, JSON.stringify(body));
      expect(a.status, a.text).toBe(200);
      return a.json.result;
    };

    beforeAll(async () => {
      tmp = await mkdtemp(path.join(tmpdir(), "skiff-storage-"));
      t = await startTestSkiff({ env: { SKIFF_PROJECT_STORAGE_BYTES: String(QUOTA) } });
      token = t.adminToken;
      const res = await fetch(`${t.url}/v2/projects`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ project_id: "p-other" }),
      });
      expect(res.status).toBe(200);
      await deploy("p-dev", "1");
      await deploy("p-other", "1");
    }, 120_000);
    afterAll(async () => {
      await t?.close();
      await rm(tmp, { recursive: true, force: true });
    });

    it("what a replica writes is read back after a redeploy; another project does not see it", async () => {
      expect(await call("p-dev", "write", { name: "note.txt", text: "kept" })).toBe("written");
      await deploy("p-dev", "2");
      expect(await call("p-dev", "read", { name: "note.txt" })).toBe("kept");
      expect(await call("p-other", "read", { name: "note.txt" })).toMatch(/^FileNotFoundError/);
      // The project's storage is a filesystem image of its own, on a loop device skiff holds; nothing of it is
      // mounted outside the sandboxes.
      const image = path.join(t.dataDir, "storage", "p-dev.img");
      expect((await lstat(image)).size).toBe(QUOTA);
      expect(loopsOf(image)).toHaveLength(1);
      expect(await readFile("/proc/self/mountinfo", "utf8")).not.toContain(t.dataDir);
    }, 120_000);

    it("a writer past SKIFF_PROJECT_STORAGE_BYTES gets ENOSPC (No space left on device); freeing room lets it write", async () => {
      const filled = await call("p-dev", "fill");
      expect(filled.error).toMatch(/^OSError: \[Errno 28\] No space left on device/);
      expect(filled.written_mib).toBeGreaterThan(8);
      expect(filled.written_mib).toBeLessThan(QUOTA / 1024 / 1024);
      // The other project's storage has its own room.
      expect(await call("p-other", "write", { name: "b.txt", text: "room" })).toBe("written");
      expect(await call("p-dev", "clear")).toBe("cleared");
      expect(await call("p-dev", "write", { name: "after.txt", text: "fits" })).toBe("written");
    }, 120_000);

    it("DeleteProject stops the project's replicas and removes its storage without following a link it left", async () => {
      const bait = path.join(tmp, "bait-other.txt");
      await writeFile(bait, "host file");
      expect(await call("p-other", "plant", { target: bait })).toEqual(["b.txt", "escape", "pipe"]);
      const storage = path.join(t.dataDir, "storage");
      const image = path.join(storage, "p-other.img");
      expect(await readdir(storage)).toContain("p-other.img");
      expect(loopsOf(image)).toHaveLength(1);
      const res = await fetch(`${t.url}/v2/projects/p-other`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${token}` },
      });
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ apps_deleted: 1, service_accounts_deleted: 0, secrets_deleted: 0 });
      await expect
        .poll(() => readdir(storage), { timeout: 60_000 })
        .not.toEqual(expect.arrayContaining(["p-other.img"]));
      expect(await readdir(storage)).not.toContain("p-other");
      expect(await readFile(bait, "utf8")).toBe("host file");
      // Its loop device is let go once its replicas are gone.
      await expect.poll(() => loopsOf(image), { timeout: 30_000 }).toEqual([]);
      expect(t.skiff.runner!.version("p-other", "disk")).toBeUndefined();
      // The other project's storage is untouched.
      expect(await call("p-dev", "read", { name: "note.txt" })).toBe("kept");
    }, 120_000);

    it("a link and a FIFO the app leaves are not followed when skiff stops and removes the storage", async () => {
      // A file of the host's, outside the storage, that a followed link would reach.
      const bait = path.join(tmp, "bait.txt");
      await writeFile(bait, "host file");
      expect(await call("p-dev", "plant", { target: bait })).toEqual(["after.txt", "escape", "note.txt", "pipe"]);
      const dataDir = t.dataDir;
      const image = path.join(dataDir, "storage", "p-dev.img");
      // skiff's stop lets go of the storage's device (it reads nothing in it); its image stays for the next start.
      await t.skiff.close();
      // With it, the file that says which incarnation of the project it belongs to (project-storage.ts claim()).
      expect(await readdir(path.join(dataDir, "storage"))).toEqual(["p-dev.img", "p-dev.owner"]);
      await expect.poll(() => loopsOf(image), { timeout: 30_000 }).toEqual([]);
      // What the app left is in the image, as the app left it.
      const look = path.join(tmp, "look");
      await mkdir(look);
      execFileSync("/usr/bin/mount", ["-o", "loop,ro", image, look]);
      try {
        expect((await lstat(path.join(look, "escape"))).isSymbolicLink()).toBe(true);
        expect((await lstat(path.join(look, "pipe"))).isFIFO()).toBe(true);
      } finally {
        execFileSync("/usr/bin/umount", [look]);
      }
      // Removal of a project's storage: attached again, then removed; the link's target is untouched.
      const storage = new ProjectStorage(dataDir, QUOTA, silentLogger, true);
      expect((await storage.source("p-dev", 424242)).kind).toBe("device");
      expect(loopsOf(image)).toHaveLength(1);
      await storage.remove("p-dev");
      expect(await readdir(path.join(dataDir, "storage"))).toEqual([]);
      expect(await readFile(bait, "utf8")).toBe("host file");
      await expect.poll(() => loopsOf(image), { timeout: 30_000 }).toEqual([]);
      await storage.close();
    }, 120_000);
  },
);
