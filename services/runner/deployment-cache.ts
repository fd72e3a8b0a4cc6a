// Unpacked and prepared deployments on this machine, one folder per bundle
// digest (`<root>/<digest>/`), so a bundle is unpacked and its dependencies
// installed once per machine however many apps, versions or processes use
// it. A deployment is prepared in a staging folder and renamed into place
// only once ready, so a folder under its digest is always complete; what it
// learned (its skiff.toml as the bundle had it, Cortex functions, the venv)
// is kept in `.skiff/prepared.json`, written only into a real `.skiff`
// folder and never through a link: the folder itself may hold what a build
// left (build-area.ts), so nothing else in it is read back.
//
// Replicas share the folder read-only (sandbox.ts binds it), so nothing is
// copied per replica. Folders no app lists any more are removed at the next
// prune: at once when this process made or used them, after
// PRUNE_MIN_AGE_MS otherwise (another process may be preparing one whose
// record does not exist yet).
import { randomBytes } from "node:crypto";
import { constants } from "node:fs";
import { lstat, mkdir, open, readdir, readFile, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import {
  APP_CONFIG_FILE,
  loadAppConfig,
  parseAppConfig,
  type AppConfig,
  BundleError,
  sha256,
  unpackBundle,
} from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { BUILD_AREA_SUFFIX, MARKER, unmount } from "./build-area.js";
import { prepareDeployment } from "./prepare.js";
import type { SandboxOptions } from "./sandbox.js";
import type { PreparedDeployment } from "./types.js";

/** A folder this process does not know, younger than this, is not pruned: another may be preparing it before its record exists. */
export const PRUNE_MIN_AGE_MS = 10 * 60 * 1000;

export interface PreparedBundle {
  /** The unpacked, prepared app folder. */
  dir: string;
  config: AppConfig;
  prepared: PreparedDeployment;
  /** What the deployment takes on disk: its files as unpacked and built, bytes. */
  unpackedBytes: number;
}

interface Marker {
  /** skiff.toml as the bundle had it, read before any build step ran. */
  config: string;
  functions?: string[];
  /** The venv's interpreter, relative to the folder: the folder moves after preparing. */
  python?: string;
  unpacked_bytes: number;
}

/**
 * Unpacks a bundle into `dir` with every safety check, reads its skiff.toml
 * and prepares it. Throws BundleError, AppConfigError or PrepareFailed.
 */
export async function prepareBundle(
  bytes: Uint8Array,
  dir: string,
  opts: { maxBytes: number; maxFiles?: number; logger: Logger; project?: string; sandbox?: SandboxOptions },
): Promise<{ config: AppConfig; configText: string; prepared: PreparedDeployment; unpackedBytes: number }> {
  const { tar } = await unpackBundle(bytes, dir, { maxBytes: opts.maxBytes, maxFiles: opts.maxFiles });
  const config = await loadAppConfig(dir);
  // Read now, from what skiff unpacked: after the build the folder holds what the build left.
  const configText = await readFile(path.join(dir, APP_CONFIG_FILE), "utf8");
  const prepared = await prepareDeployment(dir, config, opts.logger, { project: opts.project, sandbox: opts.sandbox });
  // What the deployment takes: the bundle's files, or what its build left (dependencies included).
  return { config, configText, prepared, unpackedBytes: prepared.bytes ?? tar.length };
}

/** Writes `.skiff/prepared.json` into `dir`: `.skiff` must be a folder (not a link), the file must not exist. */
async function writeMarker(dir: string, marker: Marker): Promise<void> {
  const skiff = path.join(dir, ".skiff");
  await mkdir(skiff, { recursive: true });
  const st = await lstat(skiff);
  if (!st.isDirectory()) throw new BundleError("invalid", ".skiff in the app folder is not a folder");
  const file = await open(
    path.join(dir, MARKER),
    constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
    0o644,
  );
  try {
    await file.writeFile(JSON.stringify(marker));
  } finally {
    await file.close();
  }
}

export class DeploymentCache {
  /** Preparations under way in this process, by digest. */
  private readonly pending = new Map<string, Promise<PreparedBundle>>();
  /** Digests this process prepared or loaded: no other process is preparing them. */
  private readonly known = new Set<string>();

  constructor(
    readonly root: string,
    /** `sandbox`: where deploy-time steps run (default: prepareDeployment's). */
    private readonly opts: { maxBytes: number; maxFiles?: number; logger: Logger; sandbox?: SandboxOptions },
  ) {}

  dirOf(digest: string): string {
    return path.join(this.root, digest);
  }

  /**
   * The prepared folder of the bundle with this digest; `bytes` is called
   * only when it is not prepared yet, and must give the bundle itself.
   * `project`: whose deploy it is (builds take turns by project).
   */
  get(digest: string, bytes: () => Promise<Uint8Array>, project = ""): Promise<PreparedBundle> {
    if (!/^[0-9a-f]{64}$/.test(digest))
      return Promise.reject(new BundleError("invalid", `not a sha256 digest: ${digest.slice(0, 80)}`));
    let p = this.pending.get(digest);
    if (!p) {
      p = this.load(digest).then((found) => found ?? this.make(digest, bytes, project));
      this.pending.set(digest, p);
      void p.then(
        () => this.pending.delete(digest),
        () => this.pending.delete(digest),
      );
    }
    return p;
  }

  /**
   * Removes the prepared folders (and leftover staging folders) of bundles
   * that no app keeps any more: at once for those this process knows, once
   * older than PRUNE_MIN_AGE_MS for others.
   * `keep`: the digests of every deployment the app records still list.
   * Returns the digests removed.
   */
  async prune(keep: ReadonlySet<string>, now = Date.now()): Promise<string[]> {
    const names = await readdir(this.root).catch(() => [] as string[]);
    const removed: string[] = [];
    for (const name of names) {
      const digest = /^[0-9a-f]{64}$/.test(name) ? name : undefined;
      if ((digest && (keep.has(digest) || this.pending.has(digest))) || (!digest && !name.startsWith(".staging-")))
        continue;
      const dir = path.join(this.root, name);
      const info = await stat(dir).catch(() => undefined);
      if (!info) continue;
      if (!(digest && this.known.has(digest)) && now - info.mtimeMs < PRUNE_MIN_AGE_MS) continue;
      // A build area left by a process that died mid-build may still have its tmpfs mounted.
      if (name.endsWith(BUILD_AREA_SUFFIX)) await unmount(dir);
      await rm(dir, { recursive: true, force: true });
      if (digest) {
        this.known.delete(digest);
        removed.push(digest);
      }
    }
    return removed;
  }

  private async load(digest: string): Promise<PreparedBundle | undefined> {
    const dir = this.dirOf(digest);
    let marker: Marker;
    try {
      marker = JSON.parse(await readFile(path.join(dir, MARKER), "utf8")) as Marker;
    } catch {
      return undefined;
    }
    const prepared: PreparedDeployment = {};
    if (marker.functions) prepared.functions = marker.functions;
    if (marker.python) prepared.python = path.join(dir, marker.python);
    if (typeof marker.config !== "string" || typeof marker.unpacked_bytes !== "number") return undefined;
    this.known.add(digest);
    return { dir, config: parseAppConfig(marker.config), prepared, unpackedBytes: marker.unpacked_bytes };
  }

  private async make(digest: string, bytes: () => Promise<Uint8Array>, project: string): Promise<PreparedBundle> {
    const data = await bytes();
    if (sha256(data) !== digest) throw new BundleError("invalid", `the bundle does not match its digest ${digest}`);
    await mkdir(this.root, { recursive: true });
    const staging = path.join(this.root, `.staging-${digest.slice(0, 16)}-${randomBytes(4).toString("hex")}`);
    try {
      const { prepared, unpackedBytes, configText } = await prepareBundle(data, staging, { ...this.opts, project });
      const marker: Marker = {
        config: configText,
        functions: prepared.functions,
        python: prepared.python && path.relative(staging, prepared.python),
        unpacked_bytes: unpackedBytes,
      };
      await writeMarker(staging, marker);
      await rename(staging, this.dirOf(digest)).catch(async (err: NodeJS.ErrnoException) => {
        // Another process on this machine finished the same bundle first: use theirs.
        if (err.code !== "ENOTEMPTY" && err.code !== "EEXIST") throw err;
      });
    } finally {
      await rm(staging, { recursive: true, force: true });
    }
    const done = await this.load(digest);
    if (!done) throw new Error(`prepared deployment ${digest} vanished from ${this.root}`);
    return done;
  }
}
