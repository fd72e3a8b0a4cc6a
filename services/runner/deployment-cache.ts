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
//
// A bundle whose configuration gives its build steps secrets (`[build]
// secrets`) is built per project and per value of those secrets: its digest's
// folder holds only its configuration (a stub), and each build is a folder
// `<digest>-<project>-<fingerprint>`, the fingerprint a hash of the project,
// the names and the values. Another project's deploy of the same bundle never
// gets a build made with someone else's secrets, and a changed value builds
// again; a build whose values were replaced is removed at the next prune.
import { createHash, randomBytes } from "node:crypto";
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
  /** A stub: the bundle is built per project and secret values, in folders of their own (the header). */
  per_project?: boolean;
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
    /** The secrets the build steps get, given the configuration the bundle holds (its `[build] secrets`). */
    buildSecrets?: (config: AppConfig) => Record<string, string> | undefined;
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
    buildSecrets: opts.buildSecrets?.(config),
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

/** A folder of the cache: a digest, or a per-project build `<digest>-<project>-<fingerprint>`. */
const FOLDER = /^([0-9a-f]{64})(?:-(p-[a-z0-9]{1,40})-([0-9a-f]{16}))?$/;
/** A project id as the per-project folders name it (FOLDER's second part). */
const PROJECT = /^p-[a-z0-9]{1,40}$/;

/** The folder of a per-project build: the fingerprint hashes the project, the names and their values. */
function buildFolder(digest: string, project: string, names: string[], values: Record<string, string>): string {
  const fingerprint = createHash("sha256")
    .update(JSON.stringify([project, names.map((n) => [n, values[n] ?? null])]))
    .digest("hex")
    .slice(0, 16);
  return `${digest}-${project}-${fingerprint}`;
}

/** What was prepared in a folder; a stub says the bundle is built per project. */
type Loaded = (PreparedBundle & { perProject?: false }) | { perProject: true; config: AppConfig };

export class DeploymentCache {
  /** Preparations under way in this process, by digest and project. */
  private readonly pending = new Map<string, Promise<PreparedBundle>>();
  /** Folders this process prepared or loaded: no other process is preparing them. */
  private readonly known = new Set<string>();
  /** The newest per-project build folder of each digest and project that this process used. */
  private readonly latest = new Map<string, string>();
  /** A project's secrets as environment variables; set by the runner role, which follows them. */
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

  dirOf(name: string): string {
    return path.join(this.root, name);
  }

  /**
   * The prepared folder of the bundle with this digest for `project`; `bytes`
   * is called only when it is not prepared yet, and must give the bundle
   * itself. `project`: whose deploy it is (builds take turns by project, and
   * a bundle whose build gets secrets is built per project).
   */
  get(digest: string, bytes: () => Promise<Uint8Array>, project = ""): Promise<PreparedBundle> {
    if (!/^[0-9a-f]{64}$/.test(digest))
      return Promise.reject(new BundleError("invalid", `not a sha256 digest: ${digest.slice(0, 80)}`));
    const key = `${digest} ${project}`;
    let p = this.pending.get(key);
    if (!p) {
      p = this.resolve(digest, bytes, project);
      this.pending.set(key, p);
      void p.then(
        () => this.pending.delete(key),
        () => this.pending.delete(key),
      );
    }
    return p;
  }

  private async resolve(digest: string, bytes: () => Promise<Uint8Array>, project: string): Promise<PreparedBundle> {
    const found = await this.load(digest);
    if (found && !found.perProject) return found;
    if (found?.perProject) {
      const names = found.config.buildSecrets ?? [];
      const folder = buildFolder(digest, project, names, this.secretsOf(project, names));
      const built = await this.load(folder);
      if (built && !built.perProject) {
        this.latest.set(`${digest}-${project}`, folder);
        return built;
      }
    }
    return this.make(digest, bytes, project);
  }

  /** The values of the named secrets of the project that exist. */
  private secretsOf(project: string, names: string[]): Record<string, string> {
    const env = project ? (this.projectEnv?.(project) ?? {}) : {};
    return Object.fromEntries(names.filter((n) => Object.hasOwn(env, n)).map((n) => [n, env[n]]));
  }

  /**
   * Removes the prepared folders (and leftover staging folders) of bundles
   * that no app keeps any more: at once for those this process knows, once
   * older than PRUNE_MIN_AGE_MS for others; and per-project builds whose
   * secrets this process has since built again with other values.
   * `keep`: the digests of every deployment the app records still list.
   * Returns the folders removed.
   */
  async prune(keep: ReadonlySet<string>, now = Date.now()): Promise<string[]> {
    const names = await readdir(this.root).catch(() => [] as string[]);
    const removed: string[] = [];
    const busy = new Set([...this.pending.keys()].map((k) => k.slice(0, 64)));
    for (const name of names) {
      const m = FOLDER.exec(name);
      const digest = m?.[1];
      const superseded =
        m?.[2] !== undefined && this.latest.has(`${digest}-${m[2]}`) && this.latest.get(`${digest}-${m[2]}`) !== name;
      if (digest && ((keep.has(digest) && !superseded) || busy.has(digest))) continue;
      if (!digest && !name.startsWith(".staging-")) continue;
      const dir = path.join(this.root, name);
      const info = await stat(dir).catch(() => undefined);
      if (!info) continue;
      if (!superseded && !this.known.has(name) && now - info.mtimeMs < PRUNE_MIN_AGE_MS) continue;
      // A build area left by a process that died mid-build may still have its tmpfs mounted.
      if (name.endsWith(BUILD_AREA_SUFFIX)) await unmount(dir);
      await rm(dir, { recursive: true, force: true });
      if (digest) {
        this.known.delete(name);
        removed.push(name);
      }
    }
    return removed;
  }

  private async load(name: string): Promise<Loaded | undefined> {
    const dir = this.dirOf(name);
    let marker: Marker;
    try {
      marker = JSON.parse(await readFile(path.join(dir, MARKER), "utf8")) as Marker;
    } catch {
      return undefined;
    }
    if (typeof marker.config !== "string" || typeof marker.unpacked_bytes !== "number") return undefined;
    const file = marker.config_file ?? CONFIG_FILES[0];
    if (!(CONFIG_FILES as readonly string[]).includes(file)) return undefined;
    const { config, warnings } = parseConfigFile(marker.config, file);
    this.known.add(name);
    if (marker.per_project) return { perProject: true, config };
    const prepared: PreparedDeployment = {};
    if (marker.functions) prepared.functions = marker.functions;
    if (marker.python) prepared.python = path.join(dir, marker.python);
    return { dir, config, prepared, unpackedBytes: marker.unpacked_bytes, warnings };
  }

  private async make(digest: string, bytes: () => Promise<Uint8Array>, project: string): Promise<PreparedBundle> {
    const data = await bytes();
    if (sha256(data) !== digest) throw new BundleError("invalid", `the bundle does not match its digest ${digest}`);
    await mkdir(this.root, { recursive: true });
    const staging = path.join(this.root, `.staging-${digest.slice(0, 16)}-${randomBytes(4).toString("hex")}`);
    // The digest's folder, or, for a bundle whose build gets secrets, this project's build of it.
    let folder = digest;
    try {
      const { prepared, unpackedBytes, configText, configFile } = await prepareBundle(data, staging, {
        ...this.opts,
        project,
        secrets: project ? this.projectEnv?.(project) : undefined,
        buildSecrets: (config) => {
          if (!config.buildSecrets) return undefined;
          if (!PROJECT.test(project))
            throw new BundleError("invalid", "a bundle whose build gets secrets is deployed by a project");
          const values = this.secretsOf(project, config.buildSecrets);
          folder = buildFolder(digest, project, config.buildSecrets, values);
          return values;
        },
      });
      const marker: Marker = {
        config: configText,
        config_file: configFile,
        functions: prepared.functions,
        python: prepared.python && path.relative(staging, prepared.python),
        unpacked_bytes: unpackedBytes,
      };
      await writeMarker(staging, marker);
      await rename(staging, this.dirOf(folder)).catch(async (err: NodeJS.ErrnoException) => {
        // Another process on this machine finished the same bundle first: use theirs.
        if (err.code !== "ENOTEMPTY" && err.code !== "EEXIST") throw err;
      });
      if (folder !== digest) {
        this.latest.set(`${digest}-${project}`, folder);
        await this.writeStub(digest, { ...marker, per_project: true, functions: undefined, python: undefined });
      }
    } finally {
      await rm(staging, { recursive: true, force: true });
    }
    const done = await this.load(folder);
    if (!done || done.perProject) throw new Error(`prepared deployment ${folder} vanished from ${this.root}`);
    return done;
  }

  /** The digest's folder as a stub: only the marker, which says the bundle is built per project. */
  private async writeStub(digest: string, marker: Marker): Promise<void> {
    const stub = path.join(this.root, `.staging-${digest.slice(0, 16)}-${randomBytes(4).toString("hex")}`);
    try {
      await mkdir(stub);
      await writeMarker(stub, marker);
      await rename(stub, this.dirOf(digest)).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "ENOTEMPTY" && err.code !== "EEXIST") throw err;
      });
    } finally {
      await rm(stub, { recursive: true, force: true });
    }
  }
}
