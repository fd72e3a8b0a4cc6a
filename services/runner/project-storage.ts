// Each project's persistent storage on this machine: what its replicas see
// read-write at /persistent-storage (sandbox-argv.ts STORAGE_MOUNT), kept
// across deploys, restarts and replicas.
//
// Where skiff runs as root, it is a filesystem of its own: an ext4 image of
// SKIFF_PROJECT_STORAGE_BYTES (`<dataDir>/storage/<project>.img`, sparse),
// its root owned by the project's uid. That is how a replica's own writable
// folders are bounded (a tmpfs of a fixed size), made to last: a write past
// the size fails in the writer with ENOSPC ("No space left on device"), and
// the filesystem itself counts what is used.
//
// The image is attached to a loop device (by a mount in a mount namespace of
// a helper's own, which marks the device to go away with its last user) that
// this process holds open; each sandbox's launch script mounts that device, nosuid and nodev, in
// the sandbox's own mount namespace. So no mount lives outside a sandbox: when
// skiff stops or dies, its sandboxes and its hold end, and the kernel detaches
// the device. Every sandbox mounts the same device, so they share one
// filesystem, never two views of one image.
//
// No privileged process walks the tenant's files, so no link or FIFO it
// leaves there is followed: removing the storage lets go of the device and
// deletes the image file. Without root, or where the machine cannot make such
// a filesystem (no loop devices), the storage is a plain folder, unbounded,
// bound into sandboxes, and the log says so once.
import { execFile, spawn } from "node:child_process";
import { chown, mkdir, open, readFile, rename, rm, rmdir, unlink, writeFile, type FileHandle } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import type { Logger } from "../config/index.js";

const run = promisify(execFile);
/** The programs, by absolute path: nothing of PATH. */
const MOUNT = "/usr/bin/mount";
const UNSHARE = "/usr/bin/unshare";
const FINDMNT = "/usr/bin/findmnt";
const MKFS = "/usr/sbin/mkfs.ext4";
/** The environment of those programs: fixed. */
const TOOL_ENV = { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", LANG: "C" };
/** A project id as a file name: it is one already (auth PROJECT_ID), checked again here. */
const PROJECT_FILE = /^p-[a-z0-9]{1,40}$/;
const LOOP_DEVICE = /^\/dev\/loop\d+$/;

/** What a sandbox is given: a loop device to mount, or a plain folder to bind. */
interface StorageSource {
  kind: "device" | "folder";
  path: string;
}

export class ProjectStorage {
  private readonly dir: string;
  /** Sources made ready (or being made) by this process, by project. */
  private readonly ready = new Map<string, Promise<StorageSource>>();
  /** The loop devices this process holds open, by project. */
  private readonly held = new Map<string, FileHandle>();
  /** The incarnation (see `incarnation`) each source in `ready` was made for. */
  private readonly readyFor = new Map<string, string | undefined>();
  private warned = false;
  /**
   * Which incarnation of the project is current (its record's creation
   * time), undefined when not known. A project deleted while this runner was
   * away and made again under its id is another tenant: storage kept for an
   * older incarnation (`<project>.owner` says which) is removed, never given
   * to it. Set by the runner role, which follows the projects' bucket.
   */
  incarnation?: (projectId: string) => Promise<string | undefined>;

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

  /** The project's storage for a sandbox, made and attached on first use. */
  async source(projectId: string, uid: number): Promise<StorageSource> {
    const current = await this.incarnation?.(projectId);
    // A deleted project's replica (an app of it deployed again by a reconcile racing the deletion) gets none:
    // storage made now would outlive the project, and be taken by the next project of its id.
    if (this.incarnation && current === undefined)
      throw new Error(`project ${projectId} does not exist (deleted?): no persistent storage for it`);
    // Made for a deleted project of this id, whose replicas may still be ending: never the new project's. Its
    // sandboxes keep their own mounts until they end; this process lets go of it now.
    if (this.ready.has(projectId) && this.readyFor.get(projectId) !== current) await this.remove(projectId);
    let answer = this.ready.get(projectId);
    if (!answer) {
      answer = this.make(projectId, uid, current);
      this.ready.set(projectId, answer);
      this.readyFor.set(projectId, current);
      answer.catch(() => {
        if (this.ready.get(projectId) === answer) this.ready.delete(projectId);
      });
    }
    return answer;
  }

  private paths(projectId: string): { folder: string; image: string; stage: string; owner: string } {
    if (!PROJECT_FILE.test(projectId)) throw new Error(`not a project id: ${JSON.stringify(projectId)}`);
    return {
      folder: path.join(this.dir, projectId),
      image: path.join(this.dir, `${projectId}.img`),
      stage: path.join(this.dir, `.attach-${projectId}`),
      owner: path.join(this.dir, `${projectId}.owner`),
    };
  }

  /**
   * Removes what is kept for an older incarnation of the project (see
   * `incarnation`), then says which one the storage is for. Storage made
   * before owners were written is taken as the current incarnation's.
   */
  private async claim(projectId: string, current: string | undefined): Promise<void> {
    if (current === undefined) return;
    const { folder, image, owner } = this.paths(projectId);
    const kept = await readFile(owner, "utf8").catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return undefined;
      throw err;
    });
    if (kept === current) return;
    if (kept !== undefined) {
      this.logger.info(
        { project: projectId, kept, current },
        "persistent storage of a deleted project of the same id removed; the project starts with an empty one",
      );
      await rm(image, { force: true });
      await rm(folder, { recursive: true, force: true });
    }
    // Written through a new file (never through a link: the folder is skiff's own, 0700).
    await writeFile(`${owner}.new`, current, { mode: 0o600 });
    await rename(`${owner}.new`, owner);
  }

  private async make(projectId: string, uid: number, current: string | undefined): Promise<StorageSource> {
    const { folder, image } = this.paths(projectId);
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    await this.claim(projectId, current);
    if (!this.ownFilesystem) return this.plainFolder(folder, undefined, "skiff does not run as root");
    // "wx": made here, never opened through a link; an existing image is the project's, kept.
    const handle = await open(image, "wx", 0o600).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "EEXIST") return undefined;
      throw err;
    });
    if (!handle) return this.attach(projectId, false);
    try {
      await handle.truncate(this.sizeBytes);
    } finally {
      await handle.close();
    }
    try {
      await run(MKFS, ["-q", "-F", "-m", "0", "-E", `root_owner=${uid}:${uid}`, "-L", projectId, image], {
        env: TOOL_ENV,
      });
      return await this.attach(projectId, true);
    } catch (err) {
      // Nothing was kept in it yet: the machine cannot make such filesystems (no loop devices, no mkfs.ext4).
      await unlink(image).catch(() => undefined);
      return this.plainFolder(folder, uid, (err as Error).message);
    }
  }

  /**
   * Attaches the image to a loop device through a mount (which marks the
   * device to go with its last user) made in a mount namespace of its own, by
   * a helper that lives until this process holds the device open. No mount is
   * ever made in skiff's namespace: a skiff killed at any point leaves none
   * behind on the host, and the helper's mount goes with the helper.
   */
  private async attach(projectId: string, fresh: boolean): Promise<StorageSource> {
    const { image, stage } = this.paths(projectId);
    await rm(stage, { recursive: true, force: true });
    await mkdir(stage, { mode: 0o700 });
    // Arguments are $1..$3, never part of the script; the programs by absolute path, the environment fixed.
    const script = [
      "set -e",
      `${MOUNT} -t ext4 -o loop,nosuid,nodev,noatime "$1" "$2"`,
      // A new filesystem's lost+found is root's: the project's storage holds only what the project writes.
      `if [ "$3" = fresh ]; then rmdir "$2/lost+found" 2>/dev/null || true; fi`,
      `${FINDMNT} -n -o SOURCE --mountpoint "$2"`,
      "read held", // until skiff has the device open
    ].join("\n");
    const helper = spawn(
      UNSHARE,
      ["--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", image, stage, fresh ? "fresh" : "kept"],
      { env: TOOL_ENV, stdio: ["pipe", "pipe", "pipe"] },
    );
    const exited = new Promise<number | null>((resolve) => helper.once("close", resolve));
    let stderr = "";
    helper.stderr.setEncoding("utf8").on("data", (c: string) => (stderr = (stderr + c).slice(-2000)));
    try {
      const device = await new Promise<string | undefined>((resolve) => {
        let out = "";
        helper.stdout.setEncoding("utf8").on("data", (c: string) => {
          out += c;
          if (out.includes("\n")) resolve(out.split("\n")[0].trim());
        });
        void exited.then(() => resolve(undefined));
      });
      if (!device || !LOOP_DEVICE.test(device))
        throw new Error(
          `the image of ${projectId} was not attached to a loop device (${device ?? (stderr.trim() || "no answer")})`,
        );
      this.held.set(projectId, await open(device, "r"));
      this.logger.info({ project: projectId, device, bytes: this.sizeBytes }, "persistent storage attached");
      return { kind: "device", path: device };
    } finally {
      helper.stdin.end("\n"); // the helper ends, and its mount with its namespace
      await exited;
      await rmdir(stage).catch(() => undefined);
    }
  }

  /** The storage as a plain folder, unbounded, said once in the log; `uid`: its owner, where skiff is root. */
  private async plainFolder(folder: string, uid: number | undefined, why: string): Promise<StorageSource> {
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
    return { kind: "folder", path: folder };
  }

  /**
   * Removes the project's storage on this machine (its replicas stopped):
   * lets go of its device, which the kernel then detaches, and deletes its
   * image. Nothing inside it is read or followed. A plain folder is removed
   * by rm, which unlinks links and FIFOs without following or opening them.
   * With `incarnation` (the deleted project's), storage already made for a
   * newer project of the same id is left alone.
   */
  async remove(projectId: string, incarnation?: string): Promise<void> {
    const { folder, image, owner } = this.paths(projectId);
    if (incarnation !== undefined) {
      const kept = this.ready.has(projectId)
        ? this.readyFor.get(projectId)
        : await readFile(owner, "utf8").catch(() => undefined);
      if (kept !== undefined && kept !== incarnation) return;
    }
    await this.ready.get(projectId)?.catch(() => undefined);
    this.ready.delete(projectId);
    this.readyFor.delete(projectId);
    await this.held.get(projectId)?.close();
    this.held.delete(projectId);
    await rm(image, { force: true });
    await rm(folder, { recursive: true, force: true });
    await rm(owner, { force: true });
  }

  /** Lets go of every device (the replicas are stopped); the images stay for the next start. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.ready.values()]);
    this.ready.clear();
    this.readyFor.clear();
    for (const handle of this.held.values()) await handle.close().catch(() => undefined);
    this.held.clear();
  }
}
