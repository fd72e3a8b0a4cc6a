// Each project's persistent storage on this machine: the folder its
// replicas see read-write at /persistent-storage (sandbox-argv.ts
// STORAGE_MOUNT), kept across deploys, restarts and replicas.
//
// Where skiff runs as root, the folder is a filesystem of its own: an ext4
// image of SKIFF_PROJECT_STORAGE_BYTES (`<dataDir>/storage/<project>.img`,
// sparse) mounted through a loop device, nosuid and nodev, on
// `<dataDir>/storage/<project>`, its root owned by the project's uid. That is
// how a replica's own writable folders are bounded (a tmpfs of a fixed size),
// made to last: a write past the size fails in the writer with ENOSPC ("No
// space left on device"), and the filesystem itself counts what is used. No
// privileged process ever walks the tenant's files, so no link or FIFO it
// leaves there is followed: removing the storage unmounts it and deletes the
// image file.
// Without root, or where the machine cannot make such a filesystem (no loop
// devices), the folder is a plain one, unbounded, and the log says so once.
import { execFile } from "node:child_process";
import { chown, mkdir, open, readFile, rm, rmdir, unlink } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import type { Logger } from "../config/index.js";

const run = promisify(execFile);
/** The programs, by absolute path: nothing of PATH. */
const MOUNT = "/usr/bin/mount";
const UMOUNT = "/usr/bin/umount";
const MKFS = "/usr/sbin/mkfs.ext4";
/** The environment of those programs: fixed. */
const TOOL_ENV = { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", LANG: "C" };
/** A project id as a file name: it is one already (auth PROJECT_ID), checked again here. */
const PROJECT_FILE = /^p-[a-z0-9]{1,40}$/;

/** Whether `dir` is a mount point of this process's mount namespace. */
async function mounted(dir: string): Promise<boolean> {
  const info = await readFile("/proc/self/mountinfo", "utf8");
  // Field 5 is the mount point, with spaces and backslashes escaped as octal.
  const escaped = dir.replace(/[\\ \t\n]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, "0")}`);
  return info.split("\n").some((line) => line.split(" ")[4] === escaped);
}

export class ProjectStorage {
  private readonly dir: string;
  /** Folders made ready (or being made) by this process, by project. */
  private readonly ready = new Map<string, Promise<string>>();
  /** Mounts this process made or found, which close() undoes. */
  private readonly mounts = new Set<string>();
  private warned = false;

  constructor(
    dataDir: string,
    /** SKIFF_PROJECT_STORAGE_BYTES. */
    private readonly sizeBytes: number,
    private readonly logger: Logger,
    /** Whether to make a filesystem of its own per project (skiff is root). */
    private readonly ownFilesystem = process.getuid?.() === 0,
  ) {
    this.dir = path.join(path.resolve(dataDir), "storage");
  }

  /** The host folder of the project's storage, made and mounted on first use. */
  folder(projectId: string, uid: number): Promise<string> {
    let answer = this.ready.get(projectId);
    if (!answer) {
      answer = this.make(projectId, uid);
      this.ready.set(projectId, answer);
      answer.catch(() => this.ready.delete(projectId));
    }
    return answer;
  }

  private paths(projectId: string): { mountPoint: string; image: string } {
    if (!PROJECT_FILE.test(projectId)) throw new Error(`not a project id: ${JSON.stringify(projectId)}`);
    return { mountPoint: path.join(this.dir, projectId), image: path.join(this.dir, `${projectId}.img`) };
  }

  private async make(projectId: string, uid: number): Promise<string> {
    const { mountPoint, image } = this.paths(projectId);
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    if (!this.ownFilesystem) return this.plainFolder(mountPoint, undefined, "skiff does not run as root");
    if (await mounted(mountPoint)) {
      this.mounts.add(mountPoint);
      return mountPoint;
    }
    await mkdir(mountPoint, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "EEXIST") throw err;
    });
    // "wx": made here, never opened through a link; an existing image is the project's, kept.
    const handle = await open(image, "wx", 0o600).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "EEXIST") return undefined;
      throw err;
    });
    if (handle) {
      try {
        await handle.truncate(this.sizeBytes);
      } finally {
        await handle.close();
      }
      try {
        await run(MKFS, ["-q", "-F", "-m", "0", "-E", `root_owner=${uid}:${uid}`, "-L", projectId, image], {
          env: TOOL_ENV,
        });
        await this.mount(image, mountPoint);
      } catch (err) {
        // Nothing was kept in it yet: the machine cannot make such filesystems (no loop devices, no mkfs.ext4).
        await unlink(image).catch(() => undefined);
        return this.plainFolder(mountPoint, uid, (err as Error).message);
      }
      // A new filesystem's lost+found is root's: the project's folder holds only what the project writes.
      await rmdir(path.join(mountPoint, "lost+found")).catch(() => undefined);
    } else await this.mount(image, mountPoint);
    this.logger.info({ project: projectId, bytes: this.sizeBytes }, "persistent storage mounted");
    return mountPoint;
  }

  private async mount(image: string, mountPoint: string): Promise<void> {
    await run(MOUNT, ["-t", "ext4", "-o", "loop,nosuid,nodev,noatime", image, mountPoint], { env: TOOL_ENV });
    this.mounts.add(mountPoint);
  }

  /** The storage as a plain folder, unbounded, said once in the log; `uid`: its owner, where skiff is root. */
  private async plainFolder(folder: string, uid: number | undefined, why: string): Promise<string> {
    if (!this.warned) {
      this.warned = true;
      this.logger.warn(
        { reason: why },
        "persistent storage is a plain folder on this machine, so SKIFF_PROJECT_STORAGE_BYTES is not enforced",
      );
    }
    await mkdir(folder, { recursive: true, mode: 0o700 });
    // The folder was made by skiff in its own 0700 folder: no tenant could have put a link in its place.
    if (uid !== undefined) await chown(folder, uid, uid);
    return folder;
  }

  /**
   * Removes the project's storage on this machine: unmounts it and deletes
   * its image. Nothing inside it is read or followed. A plain folder is
   * removed by rm, which does not follow links.
   */
  async remove(projectId: string): Promise<void> {
    const { mountPoint, image } = this.paths(projectId);
    this.ready.delete(projectId);
    if (this.ownFilesystem) await this.unmount(mountPoint);
    await rm(image, { force: true });
    // Empty once unmounted; a plain folder (no filesystem of its own) is removed by rm, which unlinks links and
    // FIFOs without following or opening them.
    await rm(mountPoint, { recursive: true, force: true });
  }

  private async unmount(mountPoint: string): Promise<void> {
    this.mounts.delete(mountPoint);
    if (!(await mounted(mountPoint))) return;
    try {
      await run(UMOUNT, [mountPoint], { env: TOOL_ENV });
    } catch {
      // Still busy (a process of a replica on its way out): detach it now, it goes when the last user does.
      await run(UMOUNT, ["--lazy", mountPoint], { env: TOOL_ENV });
    }
  }

  /** Unmounts what this process mounted (its replicas are stopped); the images stay for the next start. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.ready.values()]);
    this.ready.clear();
    for (const mountPoint of [...this.mounts])
      await this.unmount(mountPoint).catch((err: unknown) =>
        this.logger.warn({ err, mountPoint }, "cannot unmount a project's persistent storage"),
      );
  }
}
