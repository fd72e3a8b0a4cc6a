// Persistent storage attacked from inside a replica and around a project's
// deletion: the mount's options (nosuid, nodev), the loop device and the
// image (never reachable from a sandbox), device nodes, setuid files and
// ownership changes, hard links out of the storage; and a project deleted
// while a runner was away and made again under its id (another tenant):
// the runner, back, must not give it the deleted project's files.
// Real skiff, real sandbox, real nats-server, as root (loop devices).
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { silentLogger } from "../../services/config/logger.js";
import { ProjectStorage } from "../../services/runner/project-storage.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { machineCan } from "../helpers/machine.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const MAIN = `import errno, os, stat

ROOT = "/persistent-storage"


def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def write(name: str, text: str):
    with open(os.path.join(ROOT, name), "w") as f:
        f.write(text)
    return "written"


def read(name: str):
    try:
        with open(os.path.join(ROOT, name)) as f:
            return f.read()
    except OSError as e:
        return err(e)


def hold(ms: int):
    import time
    with open(os.path.join(ROOT, "held"), "w") as f:
        time.sleep(ms / 1000)
    return "held"


def mount_options():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == ROOT:
                return {"mount": fields[5], "super": line.split(" - ")[1].split()[2], "source": line.split(" - ")[1].split()[1]}
    return None


def devices():
    return sorted(os.listdir("/dev"))


def open_device(path: str):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return "opened"
    except OSError as e:
        return err(e)


def tricks():
    out = {}
    try:
        os.mknod(os.path.join(ROOT, "loop"), 0o600 | stat.S_IFBLK, os.makedev(7, 0))
        out["mknod_block"] = "made"
    except OSError as e:
        out["mknod_block"] = err(e)
    try:
        os.mknod(os.path.join(ROOT, "null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        out["mknod_char"] = "made"
    except OSError as e:
        out["mknod_char"] = err(e)
    p = os.path.join(ROOT, "suid")
    with open(p, "w") as f:
        f.write("#!/bin/sh\\nid -u\\n")
    try:
        os.chown(p, 0, 0)
        out["chown_root"] = "done"
    except OSError as e:
        out["chown_root"] = err(e)
    os.chmod(p, 0o4755)
    out["suid_bit_kept"] = bool(os.stat(p).st_mode & stat.S_ISUID)
    try:
        os.link("/usr/bin/env", os.path.join(ROOT, "hard"))
        out["hard_link_out"] = "made"
    except OSError as e:
        out["hard_link_out"] = err(e)
    out["owner_is_me"] = os.stat(ROOT).st_uid == os.getuid()
    try:
        os.mkdir(os.path.join(ROOT, "lost+found"))
        out["lost_found"] = "made"
    except OSError as e:
        out["lost_found"] = err(e)
    return out
`;

const isRoot = process.getuid?.() === 0;

describe.skipIf(!machineCan("persistent storage attacks", isRoot ? undefined : "they need root (loop devices)"))(
  "persistent storage, attacked",
  () => {
    let nats: TestNats;
    let tmp: string;
    let runnerData: string;
    let t: TestSkiff;

    const project = async (s: TestSkiff, projectId: string) => {
      await s.management().createProject({ projectId });
      const made = await s.management().createServiceAccount({
        projectId,
        name: "tenant",
        expiresAt: { seconds: BigInt(Math.floor(Date.now() / 1000) + 3600) },
      });
      return made.token;
    };
    const deploy = async (s: TestSkiff, projectId: string, token: string) => {
      const dir = await writeApp(tmp, {
        "skiff.toml": skiffToml({ name: "disk", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
        "main.py": MAIN,
      });
      await s.management(token).deployApp({
        projectId,
        bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
      });
    };
    const call = async (s: TestSkiff, projectId: string, token: string, fn: string, body: unknown = {}) => {
      const a = await post(`${s.url}/v4/${projectId}/disk/${fn}`, token, JSON.stringify(body));
      expect(a.status, a.text).toBe(200);
      return a.json.result;
    };

    beforeAll(async () => {
      tmp = await mkdtemp(path.join(tmpdir(), "skiff-storage-attack-"));
      runnerData = await mkdtemp(path.join(tmpdir(), "skiff-storage-runner-"));
      nats = await startNatsServer();
      t = await startTestSkiff({ nats, dataDir: runnerData, env: { SKIFF_PROJECT_STORAGE_BYTES: String(16 << 20) } });
    }, 120_000);
    afterAll(async () => {
      await t?.close();
      await nats?.stop();
      await rm(tmp, { recursive: true, force: true });
      await rm(runnerData, { recursive: true, force: true });
    });

    it("from inside: nosuid and nodev, no loop device, no device node, no root-owned or setuid file, no hard link out", async () => {
      const token = await project(t, "p-probe");
      await deploy(t, "p-probe", token);
      const mount = await call(t, "p-probe", token, "mount_options");
      expect(mount.mount.split(",")).toEqual(expect.arrayContaining(["nosuid", "nodev"]));
      const devices = (await call(t, "p-probe", token, "devices")) as string[];
      expect(devices.filter((d) => /^loop|^sd|^vd|^nvme|^dm-|^mapper$/.test(d))).toEqual([]);
      // The device named in mountinfo is not there to open, nor the host's image path.
      expect(await call(t, "p-probe", token, "open_device", { path: mount.source })).toBe("ENOENT");
      expect(
        await call(t, "p-probe", token, "open_device", { path: path.join(runnerData, "storage", "p-probe.img") }),
      ).toBe("ENOENT");
      const tricks = await call(t, "p-probe", token, "tricks");
      expect(tricks).toMatchObject({
        mknod_block: "EPERM",
        mknod_char: "EPERM",
        hard_link_out: "EXDEV",
        owner_is_me: true,
      });
      // Root is not even a uid there (EINVAL: unmapped in the sandbox's user namespace).
      expect(["EPERM", "EINVAL"]).toContain(tricks.chown_root);
    }, 120_000);

    it("a project id that is not one names no path and no mount option", async () => {
      const storage = new ProjectStorage(path.join(tmp, "ids"), 16 << 20, silentLogger);
      for (const id of ["../p-x", "p-x/../../etc", "-oexec", "p-x y", "p-x\n", "p-X", "p-", `p-${"a".repeat(41)}`])
        await expect(storage.source(id, 1_234_567), JSON.stringify(id)).rejects.toThrow(/not a project id/);
      await expect(storage.remove("../p-x")).rejects.toThrow(/not a project id/);
    });

    it("a project deleted while its replica is still busy and made again at once gets none of its files", async () => {
      const first = await project(t, "p-race");
      await deploy(t, "p-race", first);
      expect(await call(t, "p-race", first, "write", { name: "diary.txt", text: "first tenant's diary" })).toBe(
        "written",
      );
      // A long call keeps the old replica (and its storage) up while the project goes.
      const holding = post(`${t.url}/v4/p-race/disk/hold`, first, JSON.stringify({ ms: 8000 }));
      await new Promise((r) => setTimeout(r, 500));
      const deleted = await fetch(`${t.url}/v2/projects/p-race`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${t.adminToken}` },
      });
      expect(deleted.status).toBe(200);
      const second = await project(t, "p-race");
      await deploy(t, "p-race", second);
      const answer = await post(`${t.url}/v4/p-race/disk/read`, second, JSON.stringify({ name: "diary.txt" }));
      // Refused or started afresh, never the deleted project's files.
      expect(answer.text).not.toContain("first tenant");
      expect(await call(t, "p-race", second, "write", { name: "mine.txt", text: "second tenant's" })).toBe("written");
      // The deleted project's storage goes once its replica has ended; the new project's stays.
      await holding.catch(() => undefined);
      await new Promise((r) => setTimeout(r, 3_000));
      expect(await call(t, "p-race", second, "read", { name: "diary.txt" })).toBe("ENOENT");
      expect(await call(t, "p-race", second, "read", { name: "mine.txt" })).toBe("second tenant's");
      // Its image is still there for the next replica: the removal of the deleted project's left it alone.
      expect(existsSync(path.join(runnerData, "storage", "p-race.img"))).toBe(true);
    }, 120_000);

    it("a project deleted while the runner was away and made again under its id gets none of its files", async () => {
      const first = await project(t, "p-reused");
      await deploy(t, "p-reused", first);
      expect(await call(t, "p-reused", first, "write", { name: "diary.txt", text: "first tenant's diary" })).toBe(
        "written",
      );
      // The runner goes away (here: the whole skiff of that data folder); another process deletes the project
      // and an admin gives its id to another tenant.
      await t.close();
      const other = await startTestSkiff({ nats, env: { SKIFF_ROLES: "invocation,management" } });
      let second: string;
      try {
        const deleted = await fetch(`${other.url}/v2/projects/p-reused`, {
          method: "DELETE",
          headers: { authorization: `Bearer ${other.adminToken}` },
        });
        expect(deleted.status).toBe(200);
        second = await project(other, "p-reused");
        await deploy(other, "p-reused", second);
      } finally {
        await other.close();
      }
      // The runner is back, on the same data folder.
      t = await startTestSkiff({ nats, dataDir: runnerData, env: { SKIFF_PROJECT_STORAGE_BYTES: String(16 << 20) } });
      expect(await call(t, "p-reused", second, "read", { name: "diary.txt" })).toBe("ENOENT");
    }, 180_000);
  },
);
