// Where deploy-time installs write, and how what they leave becomes a
// deployment. The build's uid runs the tenant's install scripts, so what it
// leaves is untrusted data: it is never opened, changed or removed in place
// by skiff through a link. Instead:
//
//   - the build writes into a folder of its own beside the deployment: a
//     tmpfs of SKIFF_MAX_BUILD_BYTES mounted there when skiff is root (so a
//     build cannot fill the host's disk), a plain folder otherwise;
//   - afterwards (every process of the build has ended with its sandbox's
//     pid namespace) the tree is read with lstat and O_NOFOLLOW and copied
//     into a new folder that skiff owns, files and folders read-only to
//     everyone else: only files, folders and links whose targets stay in the
//     app folder or in the system folders every sandbox sees, without passing
//     through another link; no FIFO, socket or device; at most
//     SKIFF_MAX_BUILD_BYTES and SKIFF_MAX_BUILD_FILES;
//   - the build's own folder is then unmounted and removed whole; a build that
//     fails leaves nothing a later deploy trusts;
//   - at most SKIFF_MAX_CONCURRENT_BUILDS builds of a process run at once, so
//     deploys started together take at most that many tmpfs and sandboxes,
//     and one per project, so that a project's slow builds hold up its own.
import { execFile } from "node:child_process";
import { constants } from "node:fs";
import { chmod, chown, cp, lstat, mkdir, open, readdir, readlink, rm, symlink } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { PrepareFailed } from "../runs/index.js";
import { APP_MOUNT, runsAsRoot } from "./sandbox-argv.js";

const run = promisify(execFile);

export interface BuildLimits {
  /** Most bytes the build's folder may hold (its tmpfs's size when skiff is root), and its output. */
  maxBytes: number;
  /** Most files, folders and links the output may have. */
  maxFiles: number;
  /** Builds of this process at once (each a tmpfs of maxBytes and a sandbox's processes); later ones wait. */
  concurrent: number;
}

export const DEFAULT_BUILD_LIMITS: BuildLimits = { maxBytes: 2 * 1024 * 1024 * 1024, maxFiles: 200_000, concurrent: 2 };

/** The projects with a build under way in this process, and the builds waiting for a slot, in order. */
const builds = { running: new Set<string>(), waiting: [] as { project: string; go: () => void }[] };

/**
 * Runs `build` for `project` once a slot is free: at most `limits.concurrent`
 * builds of this process at once, and one per project, so that one project's
 * slow builds hold up only its own deploys: a slot that frees goes to the
 * first waiting build of another project with none under way, else to the
 * project's own next one, straight (no other caller can take it meanwhile).
 */
export async function oneBuildAtATime<T>(limits: BuildLimits, project: string, build: () => Promise<T>): Promise<T> {
  if (builds.running.size < limits.concurrent && !builds.running.has(project)) builds.running.add(project);
  else await new Promise<void>((go) => builds.waiting.push({ project, go }));
  try {
    return await build();
  } finally {
    builds.running.delete(project);
    // Another project's build first, then this project's next one.
    const ready = (w: { project: string }) => !builds.running.has(w.project);
    let next = builds.waiting.findIndex((w) => ready(w) && w.project !== project);
    if (next < 0) next = builds.waiting.findIndex(ready);
    if (next >= 0 && builds.running.size < limits.concurrent) {
      const [w] = builds.waiting.splice(next, 1);
      builds.running.add(w.project);
      w.go();
    }
  }
}

/** The marker skiff writes into a prepared deployment (deployment-cache.ts): a build may not leave one. */
export const MARKER = path.join(".skiff", "prepared.json");
/** Where a build area's folder ends: deployment-cache.ts unmounts such leftovers before removing them. */
export const BUILD_AREA_SUFFIX = ".build";

/** The system folders every sandbox sees as the host has them: links may point there. */
const SYSTEM_ROOTS = ["/usr", "/bin", "/sbin", "/lib", "/lib64"];

export interface BuildArea {
  /** The app folder the build writes in (bound writable at /app). */
  dir: string;
  /** Unmounts and removes the area. */
  close(): Promise<void>;
}

/**
 * Opens a build area beside `source` (a folder that skiff unpacked) with a
 * copy of it: the folder itself and `.skiff` belong to `uid`, the bundle's
 * files stay skiff's.
 */
export async function openBuildArea(source: string, uid: number, limits: BuildLimits): Promise<BuildArea> {
  const area = `${source}${BUILD_AREA_SUFFIX}`;
  await mkdir(area, { mode: 0o700 });
  let mounted = false;
  const close = async () => {
    if (mounted) await unmount(area);
    await rm(area, { recursive: true, force: true });
  };
  try {
    if (runsAsRoot()) {
      await run("mount", ["-t", "tmpfs", "-o", `size=${limits.maxBytes},mode=0700,nosuid,nodev`, "skiff-build", area]);
      mounted = true;
    }
    const dir = path.join(area, "app");
    await cp(source, dir, { recursive: true, verbatimSymlinks: true });
    await chmod(dir, 0o755);
    if (runsAsRoot()) {
      await chown(dir, uid, uid);
      await mkdir(path.join(dir, ".skiff"), { recursive: true });
      await chown(path.join(dir, ".skiff"), uid, uid);
    }
    return { dir, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/** Unmounts a build area's tmpfs (lazily when something still holds it). */
export async function unmount(area: string): Promise<void> {
  await run("umount", [area]).catch(() => run("umount", ["-l", area]).catch(() => undefined));
}

type Kind = "dir" | "file" | "link";

/** Why a link may not be kept, or undefined: `rel` is its place in the tree, `links` every link of the tree. */
function badLink(rel: string, target: string, links: ReadonlySet<string>): string | undefined {
  if (target === "" || target.includes("\0")) return "an empty target";
  let parts: string[];
  if (path.posix.isAbsolute(target)) {
    // ".." is applied by the kernel after the links before it, and a system folder may hold a link out of them on
    // the host (/usr/lib/ssl/private -> /etc/ssl/private): an absolute target has none.
    if (target.split("/").includes("..")) return "a target that climbs with ..";
    const t = path.posix.normalize(target);
    if (SYSTEM_ROOTS.some((r) => t === r || t.startsWith(r + "/"))) return undefined;
    if (t !== APP_MOUNT && !t.startsWith(APP_MOUNT + "/")) return "a target outside the app folder";
    parts = t.slice(APP_MOUNT.length).split("/");
  } else parts = [...path.posix.dirname(rel).split("/"), ...target.split("/")];
  const at: string[] = [];
  const named = parts.filter((p) => p !== "" && p !== ".");
  for (const [i, part] of named.entries()) {
    if (part === "..") {
      if (at.length === 0) return "a target outside the app folder";
      at.pop();
      continue;
    }
    at.push(part);
    const prefix = at.join("/");
    // The last part may be a link (a venv's bin/python -> python3): the kernel resolves it on its own, and that
    // link is judged by the same rules. A link before it would decide where a later ".." or name lands.
    if (links.has(prefix) && prefix !== rel && i < named.length - 1) return "a target through another link";
  }
  return undefined;
}

/**
 * Copies the tree a build left in `from` into `to` (which must not exist),
 * owned by skiff and read-only to others; gives back the bytes of its files.
 * Throws PrepareFailed naming the first entry that is refused.
 */
export async function copyBuildOutput(from: string, to: string, limits: BuildLimits): Promise<number> {
  // First every entry, without following anything, so that each link is judged against all the others.
  const entries: { rel: string; kind: Kind; mode: number }[] = [];
  const links = new Set<string>();
  let bytes = 0;
  const refuse = (rel: string, why: string) =>
    new PrepareFailed(`the build left ${JSON.stringify(rel.slice(0, 200))}, ${why}: nothing was deployed`);
  // A tree deeper than the host's longest path (made with relative paths in the sandbox) is the build's fault,
  // refused without a path of this machine.
  const tooLong = (rel: string) => (err: NodeJS.ErrnoException) => {
    throw err.code === "ENAMETOOLONG" ? refuse(rel, "a path longer than this machine allows") : err;
  };
  const walk = async (rel: string): Promise<void> => {
    const names = await readdir(path.join(from, rel)).catch(tooLong(rel));
    for (const name of names) {
      const r = rel === "" ? name : `${rel}/${name}`;
      if (r === MARKER) throw refuse(r, "which is skiff's own marker");
      const st = await lstat(path.join(from, r)).catch(tooLong(r));
      if (entries.length >= limits.maxFiles)
        throw new PrepareFailed(
          `the build left more than ${limits.maxFiles} files (SKIFF_MAX_BUILD_FILES): nothing was deployed`,
        );
      if (st.isDirectory()) {
        entries.push({ rel: r, kind: "dir", mode: st.mode });
        await walk(r);
      } else if (st.isFile()) {
        bytes += st.size;
        if (bytes > limits.maxBytes)
          throw new PrepareFailed(
            `the build left more than ${limits.maxBytes} bytes (SKIFF_MAX_BUILD_BYTES): nothing was deployed`,
          );
        entries.push({ rel: r, kind: "file", mode: st.mode });
      } else if (st.isSymbolicLink()) {
        entries.push({ rel: r, kind: "link", mode: 0 });
        links.add(r);
      } else throw refuse(r, "which is not a file, folder or link (a FIFO, socket or device)");
    }
  };
  await walk("");
  await mkdir(to, { mode: 0o755 });
  for (const e of entries) {
    const src = path.join(from, e.rel);
    const dest = path.join(to, e.rel);
    if (e.kind === "dir") await mkdir(dest, { mode: 0o755 });
    else if (e.kind === "link") {
      const target = await readlink(src);
      const why = badLink(e.rel, target, links);
      if (why) throw refuse(e.rel, `a link with ${why}`);
      await symlink(target, dest);
    } else await copyFile(src, dest, e.mode & 0o111 ? 0o755 : 0o644);
  }
  return bytes;
}

/** Copies one regular file without following a link at `src`, and refuses one that changed kind. */
async function copyFile(src: string, dest: string, mode: number): Promise<void> {
  const input = await open(src, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    if (!(await input.stat()).isFile())
      throw new PrepareFailed(`the build changed ${path.basename(src)} while it was read`);
    const output = await open(
      dest,
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      mode,
    );
    try {
      const buf = Buffer.allocUnsafe(1024 * 1024);
      for (;;) {
        const { bytesRead } = await input.read(buf, 0, buf.length, null);
        if (bytesRead === 0) break;
        await output.write(buf, 0, bytesRead);
      }
    } finally {
      await output.close();
    }
  } finally {
    await input.close();
  }
}
