// Unpacked and prepared deployments on this machine, one folder per bundle
// digest (`<root>/<digest>/`), so a bundle is unpacked and its dependencies
// installed once per machine however many apps, versions or processes use
// it. A deployment is prepared in a staging folder and renamed into place
// only once ready, so a folder under its digest is always complete; what it
// learned (its configuration file as the bundle had it, Cortex functions, the venv)
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
  type AppConfig,
  BundleError,
  CONFIG_FILES,
  type ConfigFileName,
  parseConfigFile,
  readAppConfig,
  removeUnselected,
  sha256,
  unpackBundle,
} from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { BUILD_AREA_SUFFIX, MARKER, unmount } from "./build-area.js";
import { prepareDeployment } from "./prepare.js";
import type { SandboxOptions } from "./sandbox.js";
import type { AppLogLine, PreparedDeployment } from "./types.js";

/** The replica id of the lines a deploy writes into its app's log. */
export const DEPLOY_LOG_REPLICA = "deploy";
/** A folder this process does not know, younger than this, is not pruned: another may be preparing it before its record exists. */
export const PRUNE_MIN_AGE_MS = 10 * 60 * 1000;

export interface PreparedBundle {
  /** The unpacked, prepared app folder. */
  dir: string;
  config: AppConfig;
  prepared: PreparedDeployment;
  /** What the deployment takes on disk: its files as unpacked and built, bytes. */
  unpackedBytes: number;
  /** What its configuration file asks that skiff ignores. */
  warnings: string[];
}

interface Marker {
  /** The configuration file as the bundle had it, read before any build step ran. */
  config: string;
  /** Its name; skiff.toml when absent. */
  config_file?: ConfigFileName;
  functions?: string[];
  /** The venv's interpreter, relative to the folder: the folder moves after preparing. */
  python?: string;
  unpacked_bytes: number;
}

/**
 * Unpacks a bundle into `dir` with every safety check, reads its
 * configuration file (skiff.toml or cerebrium.toml), removes the files its
 * globs leave out and prepares it. Throws BundleError, AppConfigError or
 * PrepareFailed.
 */
export async function prepareBundle(
  bytes: Uint8Array,
  dir: string,
  opts: {
    maxBytes: number;
    maxFiles?: number;
    logger: Logger;
    project?: string;
    sandbox?: SandboxOptions;
    /** The app's log: the deploy's warnings and its build commands' output, as lines of replica "deploy". */
    onLog?: (line: AppLogLine) => void;
    /** The project's secrets, for the import check (PrepareOptions.secrets). */
    secrets?: Record<string, string>;
  },
): Promise<{
  config: AppConfig;
  configText: string;
  configFile: ConfigFileName;
  prepared: PreparedDeployment;
  unpackedBytes: number;
  warnings: string[];
}> {
  const { tar } = await unpackBundle(bytes, dir, { maxBytes: opts.maxBytes, maxFiles: opts.maxFiles });
  // Read now, from what skiff unpacked: after the build the folder holds what the build left.
  const { config, text: configText, file: configFile, warnings } = await readAppConfig(dir);
  // A bundle sent through the API obeys the globs as one that `skiff deploy` packed.
  await removeUnselected(dir, config);
  const deployLog = (stream: AppLogLine["stream"], text: string) =>
    opts.onLog?.({
      projectId: opts.project ?? "",
      appName: config.app.name,
      replicaId: DEPLOY_LOG_REPLICA,
      stream,
      text,
      time: new Date(),
    });
  for (const w of warnings) {
    opts.logger.warn({ dir, project: opts.project, app: config.app.name }, w);
    deployLog("stderr", `warning: ${w}`);
  }
  const prepared = await prepareDeployment(dir, config, opts.logger, {
    project: opts.project,
    sandbox: opts.sandbox,
    onOutput: opts.onLog && opts.project ? deployLog : undefined,
    secrets: opts.secrets,
  });
  // What the deployment takes: the bundle's files, or what its build left (dependencies included).
  return { config, configText, configFile, prepared, unpackedBytes: prepared.bytes ?? tar.length, warnings };
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
  /** A project's secrets as environment variables, for the import check; set by the runner role, which follows them. */
  projectEnv?: (projectId: string) => Record<string, string>;

  constructor(
    readonly root: string,
    /** `sandbox`: where deploy-time steps run (default: prepareDeployment's); `onLog`: the apps' logs. */
    private readonly opts: {
      maxBytes: number;
      maxFiles?: number;
      logger: Logger;
      sandbox?: SandboxOptions;
      onLog?: (line: AppLogLine) => void;
    },
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
    const file = marker.config_file ?? CONFIG_FILES[0];
    if (!(CONFIG_FILES as readonly string[]).includes(file)) return undefined;
    this.known.add(digest);
    const { config, warnings } = parseConfigFile(marker.config, file);
    return { dir, config, prepared, unpackedBytes: marker.unpacked_bytes, warnings };
  }

  private async make(digest: string, bytes: () => Promise<Uint8Array>, project: string): Promise<PreparedBundle> {
    const data = await bytes();
    if (sha256(data) !== digest) throw new BundleError("invalid", `the bundle does not match its digest ${digest}`);
    await mkdir(this.root, { recursive: true });
    const staging = path.join(this.root, `.staging-${digest.slice(0, 16)}-${randomBytes(4).toString("hex")}`);
    try {
      const { prepared, unpackedBytes, configText, configFile } = await prepareBundle(data, staging, {
        ...this.opts,
        project,
        secrets: project ? this.projectEnv?.(project) : undefined,
      });
      const marker: Marker = {
        config: configText,
        config_file: configFile,
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
