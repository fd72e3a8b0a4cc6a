// Readies an unpacked app folder once per deployment, before any replica
// starts: installs its dependencies and, for a Cortex app, lists its public
// functions so that unknown names are refused without starting a replica.
//
//   Cortex Node and Custom: package.json with dependencies → `npm ci` (with
//         package-lock.json) or `npm install`, production dependencies only,
//         into node_modules/.
//   Cortex Python: requirements.txt with requirements → a venv in
//         .skiff/venv that sees the system's packages
//         (--system-site-packages: the requirements the machine already
//         satisfies are left out, and need no index) and `pip install` of
//         the rest with the machine's pip; PrepareFailed when no package
//         index can provide them. The index is the operator's (SKIFF_PIP_INDEX_URL,
//         SKIFF_PIP_EXTRA_INDEX_URL, /etc/pip.conf). (A Custom Python app of
//         a skiff.toml vendors its packages: its command runs with the
//         replica PATH.)
//   cerebrium.toml: its [cerebrium.dependencies.pip] and paths.pip go to
//         the same venv, for either runtime (a Custom app's command finds
//         the venv first on its PATH); [..npm] to `npm install`; its apt and
//         conda packages must be on the machine (dpkg's status), never
//         installed by a tenant; its pre_build_commands run before the
//         installs and its shell_commands after them, each with /bin/sh -c
//         in the same sandbox, their output to the runner's and the app's
//         log, a failing one failing the deploy with its exit code and last
//         lines.
//
// Every step runs in the sandbox (sandbox.ts) as the deployment's own
// build uid, unless the sandbox is off: installs see the folder writable at
// /app and the network not at all (a package index must be reachable
// without it, e.g. vendored packages or a local path); the import check sees
// it as a replica does. Installs run with installEnv(): fixed values,
// nothing of the operator's environment or the platform's.
//
// A failure is reported without the tools' output or any path of this
// machine (it could quote any file the step can read): a generic reason, the
// app file and line when known; the output goes to the runner's log.
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { chmod, lstat, mkdir, open, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { type AppConfig, PIP_SPECIFIER } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { PrepareFailed } from "../runs/index.js";
import { copyBuildOutput, DEFAULT_BUILD_LIMITS, oneBuildAtATime, openBuildArea } from "./build-area.js";
import { commandExists } from "./replica.js";
import { installEnv, programPath, REPLICA_PATH, replicaEnv } from "./replica-env.js";
import { defaultSandbox, signalSandbox, spawnSandboxed, type SandboxOptions } from "./sandbox.js";
import { APP_MOUNT, buildUid, SHIM_DIR, SHIM_MOUNT } from "./sandbox-argv.js";
import type { PreparedDeployment } from "./types.js";

export { SHIM_DIR };
export const PYTHON_SHIM = path.join(SHIM_DIR, "cortex.py");
export const NODE_SHIM = path.join(SHIM_DIR, "cortex.mjs");
/** The system interpreter, found on the replica PATH. */
export const SYSTEM_PYTHON = "python3";
export const DEFAULT_INSTALL_TIMEOUT_MS = 10 * 60_000;
/** How much of a failed command's output an error message quotes. */
const TAIL_CHARS = 2000;
/** How much of a failed command's output is kept, from its end. */
const KEPT_CHARS = 1_000_000;
/**
 * Output of a step read in a second; past it, reading waits for the next
 * second (and the step's writes wait on the full pipe). A step runs the
 * tenant's code, and reading a flood costs the thread that serves every
 * caller, as a replica's does (LOG_BYTES_PER_SECOND).
 */
const OUTPUT_BYTES_PER_SECOND = 4 * 1024 * 1024;

export interface CommandResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

interface StepOptions {
  cwd: string;
  env: Record<string, string>;
  timeoutMs: number;
  /** Run in the sandbox (the folder at /app) as `uid`, writable for installs. */
  sandbox?: { options: SandboxOptions; writable: boolean; uid: number };
}

/** Runs a command to its end, in its own process group (or sandbox) so a timeout kills all of it. */
export function runCommand(command: string, args: string[], opts: StepOptions): Promise<CommandResult> {
  return new Promise((resolve, reject) => {
    const sb = opts.sandbox;
    const sandboxed = sb?.options.enabled
      ? spawnSandboxed(sb.options.host, {
          appDir: opts.cwd,
          writableApp: sb.writable,
          uid: sb.uid,
          // Installs may need room for a package cache in /tmp.
          limits: sb.writable
            ? { ...sb.options.limits, tmpMb: Math.max(sb.options.limits.tmpMb, 1024) }
            : sb.options.limits,
          command,
          args,
          env: opts.env,
          // Installs may fetch packages; the import check runs the app's code, which needs no network.
          network: sb.writable ? sb.options.network : "none",
        })
      : undefined;
    const child =
      sandboxed?.child ??
      spawn(command, args, {
        cwd: opts.cwd,
        env: opts.env,
        stdio: ["ignore", "pipe", "pipe"],
        detached: true,
      });
    const stdout = new Tail(KEPT_CHARS);
    const stderr = new Tail(KEPT_CHARS);
    const outputs = [child.stdout!, child.stderr!];
    let second = 0;
    let read = 0;
    let paused = false;
    const counted = (chars: number) => {
      const now = Date.now();
      if (now - second >= 1000) [second, read] = [now, 0];
      read += chars;
      if (read <= OUTPUT_BYTES_PER_SECOND || paused) return;
      paused = true;
      for (const o of outputs) o.pause();
      setTimeout(
        () => {
          paused = false;
          for (const o of outputs) o.resume();
        },
        second + 1000 - now,
      ).unref();
    };
    child.stdout!.setEncoding("utf8").on("data", (c: string) => {
      stdout.push(c);
      counted(c.length);
    });
    child.stderr!.setEncoding("utf8").on("data", (c: string) => {
      stderr.push(c);
      counted(c.length);
    });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      stderr.push(`\n(stopped after ${opts.timeoutMs} ms)`);
      if (sandboxed) signalSandbox(sandboxed, "SIGKILL");
      else if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL");
    }, opts.timeoutMs);
    child.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code: timedOut ? null : code, stdout: stdout.text(), stderr: stderr.text() });
    });
  });
}

/** The last `max` characters of a text that comes in pieces, kept without copying them at every piece. */
class Tail {
  private readonly parts: string[] = [];
  private length = 0;

  constructor(private readonly max: number) {}

  push(piece: string): void {
    this.parts.push(piece);
    this.length += piece.length;
    while (this.parts.length > 1 && this.length - this.parts[0].length >= this.max)
      this.length -= this.parts.shift()!.length;
  }

  text(): string {
    return this.parts.join("").slice(-this.max);
  }
}

function tail(text: string): string {
  const t = text.trim();
  return t.length > TAIL_CHARS ? `…${t.slice(-TAIL_CHARS)}` : t;
}

async function readText(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

/** How a step ended, for a message: its exit code or that it ran out of time. */
const ended = (r: CommandResult, what: string) =>
  r.code === null ? `${what} did not finish in time` : `${what} exited with ${r.code}`;

interface Context {
  /** The folder the steps see at /app: the build area while installing, then the deployment. */
  dir: string;
  timeoutMs: number;
  logger: Logger;
  sandbox: SandboxOptions;
  /** The uid the steps run as. */
  uid: number;
  /** Whose deploy this is: builds take turns by project. */
  project: string;
  pip?: PipIndex;
  onOutput?: PrepareOptions["onOutput"];
  secrets?: Record<string, string>;
  buildSecrets?: Record<string, string>;
  /** What the deploy may still write into the app's log (DEPLOY_LOG_BYTES, DEPLOY_LOG_TOTAL_LINES), shared by its steps. */
  logLeft?: { bytes: number; lines: number; cut: boolean };
}

/** Where pip looks for packages besides /etc/pip.conf: SKIFF_PIP_INDEX_URL and SKIFF_PIP_EXTRA_INDEX_URL. */
export interface PipIndex {
  indexUrl?: string;
  extraIndexUrls?: string[];
}

/**
 * Where an install runs: in the folder, with the secrets the app's
 * `[build] secrets` names, then installEnv() and the operator's package
 * index, which win over a secret of the same name.
 */
const installSetting = (c: Context) => ({
  cwd: c.dir,
  env: { ...c.buildSecrets, ...installEnv(), ...pipIndexEnv(c.pip) },
});

/** The operator's package index for pip (never the tenant's: a config cannot set these). */
function pipIndexEnv(pip: PipIndex | undefined): Record<string, string> {
  const env: Record<string, string> = {};
  if (pip?.indexUrl) env.PIP_INDEX_URL = pip.indexUrl;
  if (pip?.extraIndexUrls?.length) env.PIP_EXTRA_INDEX_URL = pip.extraIndexUrls.join(" ");
  return env;
}

/** `npm ci` (with a lock file) or `npm install` of the production dependencies. */
async function installNode(c: Context, config: AppConfig): Promise<void> {
  const inline = config.build?.npm ?? [];
  // Looked at, never opened: the tenant's code may have run in the folder already (pre_build_commands, a Python
  // package's build), and root would read through a link or wait on a FIFO it left there.
  const ci = inline.length === 0 && (await regularFile(path.join(c.dir, "package-lock.json")));
  const args = [ci ? "ci" : "install", "--omit=dev", "--no-audit", "--no-fund", "--install-links"];
  // A cerebrium.toml's [cerebrium.dependencies.npm], each checked to be a package name and version.
  if (inline.length > 0) args.push("--no-save", "--", ...inline);
  c.logger.info({ dir: c.dir, command: `npm ${args.join(" ")}` }, "installing the app's npm dependencies");
  const r = await runCommand("npm", args, { ...installSetting(c), timeoutMs: c.timeoutMs, sandbox: step(c, true) });
  if (r.code !== 0) {
    c.logger.warn({ dir: c.dir, output: stepOutput(c, r.stderr || r.stdout) }, `npm ${args[0]} failed`);
    const code = /^npm (?:ERR!|error) code ([A-Z][A-Z0-9_]{1,40})$/m.exec(r.stderr)?.[1];
    throw new PrepareFailed(
      `npm ${args[0]} failed for ${inline.length > 0 ? "the npm dependencies" : "package.json"} (${ended(r, "npm")}${code ? `, code ${code}` : ""})`,
    );
  }
}

/**
 * A requirement as pip quotes it: a name, extras, specifiers separated by
 * commas. pip's output is the tenant's (its own pip, a package's build), so
 * the pattern matches in linear time (PIP_SPECIFIER): no exponential
 * backtracking on the thread that serves every caller.
 */
const REQUIREMENT = new RegExp(
  String.raw`^[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[A-Za-z0-9._,-]*\])?\s*(?:${PIP_SPECIFIER}(?:\s*,\s*${PIP_SPECIFIER})*)?\s*,?\s*$`,
);

/** Requirement names pip found no distribution for, as the app wrote them (checked to be requirement-shaped). */
function missingRequirements(output: string): string[] {
  const names: string[] = [];
  for (const m of output.matchAll(/No matching distribution found for ([^\n]{1,200})/g)) {
    const req = m[1].trim();
    if (REQUIREMENT.test(req)) names.push(req);
  }
  return names;
}

/** True when requirements.txt names at least one requirement. */
function hasRequirements(text: string): boolean {
  return text.split(/\r?\n/).some((l) => l.replace(/#.*$/, "").trim() !== "");
}

function step(c: Context, writable: boolean): StepOptions["sandbox"] {
  return c.sandbox.enabled ? { options: c.sandbox, writable, uid: c.uid } : undefined;
}

/**
 * Run by the venv's Python in the build sandbox: writes to argv[1] the lines
 * of the requirements files (argv[2:]) that the environment does not
 * satisfy already, and prints how many. A file with anything but plain
 * requirements (options, paths, URLs) is kept whole, by reference.
 */
const UNSATISFIED_SCRIPT = `
import sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
out, files = sys.argv[1], sys.argv[2:]
keep = []
def plain(line):
    try:
        req = Requirement(line)
    except Exception:
        return None
    return None if req.url else req
for name in files:
    lines = [l.split(" #")[0].strip() for l in open(name, encoding="utf-8") if not l.lstrip().startswith("#")]
    lines = [l for l in lines if l]
    reqs = [plain(l) for l in lines]
    if any(r is None for r in reqs):
        keep.append("-r ../" + name)
        continue
    for line, req in zip(lines, reqs):
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            keep.append(line)
with open(out, "w", encoding="utf-8") as f:
    f.write("".join(l + "\\n" for l in keep))
print(len(keep))
`;

/** The requirements files pip reads (-r each), relative to the folder: requirements.txt, or what a cerebrium.toml names. */
async function requirementFiles(c: Context, config: AppConfig): Promise<string[]> {
  const build = config.build;
  if (!build) return ["requirements.txt"];
  const files = [...build.pipFiles];
  if (build.pip.length > 0) {
    // Written by skiff into the build's own .skiff before any of the tenant's commands run there.
    const rel = path.join(".skiff", "requirements.txt");
    await mkdir(path.join(c.dir, ".skiff"), { recursive: true });
    const file = await open(
      path.join(c.dir, rel),
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      0o644,
    );
    try {
      await file.writeFile(build.pip.join("\n") + "\n");
    } finally {
      await file.close();
    }
    files.push(rel);
  }
  return files;
}

/** Installs the Python requirements into a venv in `.skiff/venv`; its interpreter, relative to the folder. */
async function installPython(c: Context, config: AppConfig, requirements: string[]): Promise<string> {
  const venvRel = path.join(".skiff", "venv");
  const venv = path.join(c.dir, venvRel);
  // In the sandbox the folder is /app: the venv works wherever the folder is bound later.
  const venvSeen = c.sandbox.enabled ? path.posix.join(APP_MOUNT, venvRel) : venv;
  const setting = installSetting(c);
  const what = config.build ? "the Python requirements" : "requirements.txt";
  c.logger.info({ dir: c.dir, requirements }, "installing the app's Python requirements into a venv");
  // The venv sees the system's packages: what the machine has (Debian's python3-*) is not downloaded again.
  // Without a copy of pip (about 20 MB a deployment): the system's pip serves the venv, else ensurepip adds one below.
  const made = await runCommand(SYSTEM_PYTHON, ["-m", "venv", "--system-site-packages", "--without-pip", venvSeen], {
    ...setting,
    timeoutMs: c.timeoutMs,
    sandbox: step(c, true),
  });
  if (made.code !== 0) {
    c.logger.warn({ dir: c.dir, output: stepOutput(c, made.stderr || made.stdout) }, "python -m venv failed");
    throw new PrepareFailed(`could not create a Python venv for ${what} (${ended(made, "python -m venv")})`);
  }
  // What the machine already satisfies is left out: pip would otherwise check the installed packages' own
  // requirements against an index (Debian's metadata does not always agree with the versions it ships).
  const missingRel = path.join(".skiff", "requirements-missing.txt");
  const filtered = await runCommand(
    path.posix.join(venvSeen, "bin", "python"),
    ["-I", "-c", UNSATISFIED_SCRIPT, missingRel, ...requirements],
    { ...setting, timeoutMs: c.timeoutMs, sandbox: step(c, true) },
  );
  if (filtered.code !== 0) {
    c.logger.warn(
      { dir: c.dir, output: stepOutput(c, filtered.stderr || filtered.stdout) },
      "reading the requirements failed",
    );
    throw new PrepareFailed(`could not read ${what} (${ended(filtered, "the requirements check")})`);
  }
  const toInstall = filtered.stdout.trim();
  if (toInstall === "0") {
    c.logger.info({ dir: c.dir }, "the machine satisfies every Python requirement: nothing to install");
    return path.join(venvRel, "bin", "python");
  }
  const hasPip = await runCommand(path.posix.join(venvSeen, "bin", "python"), ["-I", "-c", "import pip"], {
    ...setting,
    timeoutMs: c.timeoutMs,
    sandbox: step(c, true),
  });
  if (hasPip.code !== 0) {
    const ensured = await runCommand(path.posix.join(venvSeen, "bin", "python"), ["-I", "-m", "ensurepip"], {
      ...setting,
      timeoutMs: c.timeoutMs,
      sandbox: step(c, true),
    });
    if (ensured.code !== 0) {
      c.logger.warn(
        { dir: c.dir, output: stepOutput(c, ensured.stderr || ensured.stdout) },
        "python -m ensurepip failed",
      );
      throw new PrepareFailed(
        `could not install ${what}: the machine's Python has no pip (${ended(ensured, "ensurepip")})`,
      );
    }
  }
  const pip = await runCommand(
    path.posix.join(venvSeen, "bin", "python"),
    ["-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-r", missingRel],
    { ...setting, timeoutMs: c.timeoutMs, sandbox: step(c, true) },
  );
  if (pip.code !== 0) {
    const output = pip.stderr + "\n" + pip.stdout;
    c.logger.warn({ dir: c.dir, output: stepOutput(c, output) }, "pip install of the requirements failed");
    const missing = missingRequirements(output);
    if (missing.length > 0)
      throw new PrepareFailed(
        `could not install ${what}: no reachable package index provides them (${ended(pip, "pip")}). ` +
          `Vendor the packages into the app folder, install them on the machine (the venv sees the system's packages), ` +
          `or make a package index reachable from the runner (SKIFF_PIP_INDEX_URL).\n` +
          `Not found: ${missing.join(", ")}`,
      );
    const from = /\(from line (\d+) of ([\w./-]{1,200})\)/.exec(output);
    const named = from && requirements.includes(from[2]) ? from : undefined;
    throw new PrepareFailed(
      `could not install ${what} (${ended(pip, "pip")})` +
        (named ? `: line ${named[1]} of ${named[2]} cannot be installed as written` : "") +
        ". A requirements file may name packages and options, not files outside the app folder.",
    );
  }
  return path.join(venvRel, "bin", "python");
}

/** Why a module did not load, from the shim's last line: its error's type, code and app file:line only. */
function loadFailure(entry: string, stdoutLast: string, r: CommandResult, app: string): PrepareFailed {
  let info: { type?: unknown; code?: unknown; where?: unknown } | undefined;
  try {
    info = (JSON.parse(stdoutLast) as { error?: typeof info }).error;
  } catch {
    info = undefined;
  }
  const type = typeof info?.type === "string" && /^[A-Za-z_][\w.]{0,80}$/.test(info.type) ? info.type : undefined;
  const code = typeof info?.code === "string" && /^[A-Z][A-Z0-9_]{1,60}$/.test(info.code) ? info.code : undefined;
  const where =
    typeof info?.where === "string" && /^[\w./@+-]{1,200}:\d{1,7}$/.test(info.where) && !info.where.startsWith("/")
      ? info.where
      : undefined;
  // The module's own words (which may quote the project's secrets) are in the app's log, its deployer's to read.
  const logs = `; its output is in the app's log: skiff logs ${app}`;
  if (!type)
    return new PrepareFailed(`cannot load ${entry}:\nthe module did not load (${ended(r, "the import check")})${logs}`);
  const known: Record<string, string> = {
    ERR_MODULE_NOT_FOUND: "Cannot find module (an import names a file or package the app does not have)",
    ModuleNotFoundError: "Cannot find module (an import names a module the app does not have)",
  };
  const what = known[code ?? type] ?? "raised while the module was imported";
  return new PrepareFailed(
    `cannot load ${entry}:\n${type}${code ? ` [${code}]` : ""}: ${what}${where ? ` at ${where}` : ""}${logs}`,
  );
}

/** Runs a shim in --list mode: the public functions, as the replica will serve them. */
async function listFunctions(c: Context, config: AppConfig, python: string | undefined): Promise<string[]> {
  if (config.runtime.kind !== "cortex") return [];
  const { language, entry } = config.runtime;
  const sandboxed = c.sandbox.enabled;
  const shim = (name: string) => (sandboxed ? `${SHIM_MOUNT}/${name}` : path.join(SHIM_DIR, name));
  const venv = python && sandboxed ? path.posix.join(APP_MOUNT, path.relative(c.dir, python)) : python;
  const [command, args] =
    language === "python"
      ? [venv ?? SYSTEM_PYTHON, ["-u", shim("cortex.py"), "--list", entry]]
      : [process.execPath, [shim("cortex.mjs"), "--list", entry]];
  const r = await runCommand(command, args, {
    cwd: c.dir,
    // As a replica's: the project's secrets, then the app's [env], which wins.
    env: { ...c.secrets, ...replicaEnv(config.env, sandboxed ? APP_MOUNT : c.dir, 0) },
    timeoutMs: c.timeoutMs,
    sandbox: step(c, false),
  });
  const last = r.stdout.trimEnd().split("\n").pop() ?? "";
  if (r.code === 0) {
    try {
      const names = JSON.parse(last) as unknown;
      if (Array.isArray(names) && names.every((n) => typeof n === "string")) return names as string[];
    } catch {
      // reported below
    }
  }
  // What the module printed goes to the app's log only, as a replica's output does: it ran with the project's
  // secrets, which must not reach skiff's own log.
  stepToAppLog(c, r);
  c.logger.warn({ dir: c.dir, entry, project: c.project }, `cannot load ${entry}; its output is in the app's log`);
  throw loadFailure(entry, last, r, config.app.name);
}

/**
 * Makes the folder skiff unpacked readable by every sandbox uid: no set-id
 * bits, no writes by others. Links are neither followed nor changed.
 */
async function settle(dir: string): Promise<void> {
  const walk = async (p: string): Promise<void> => {
    const st = await lstat(p);
    if (st.isSymbolicLink()) return;
    const mode = st.mode & 0o7777;
    const want = st.isDirectory() || mode & 0o111 ? mode | 0o555 : mode | 0o444;
    const clean = want & ~0o6000 & ~0o022;
    if (clean !== mode) await chmod(p, clean);
    if (st.isDirectory()) for (const name of await readdir(p)) await walk(path.join(p, name));
  };
  await walk(dir);
}

/** What a build does: which installs, and the commands of a cerebrium.toml around them. */
interface BuildPlan {
  python: boolean;
  node: boolean;
  pre: string[];
  post: string[];
}

const needsBuild = (p: BuildPlan) => p.python || p.node || p.pre.length > 0 || p.post.length > 0;

/** Whether package.json names dependencies. */
async function packageDependencies(dir: string): Promise<boolean> {
  const text = await readText(path.join(dir, "package.json"));
  if (text === undefined) return false;
  try {
    const pkg = JSON.parse(text) as { dependencies?: Record<string, string> };
    return Object.keys(pkg.dependencies ?? {}).length > 0;
  } catch {
    throw new PrepareFailed("package.json is not valid JSON");
  }
}

/**
 * What the app's build does: a requirements.txt (Cortex Python) or
 * package.json dependencies for a skiff.toml; what a cerebrium.toml lists.
 */
async function buildPlan(dir: string, config: AppConfig): Promise<BuildPlan> {
  const { runtime, build } = config;
  if (build) {
    for (const f of build.pipFiles)
      if (!(await regularFile(path.join(dir, f))))
        throw new PrepareFailed(
          `cerebrium.dependencies.paths.pip names ${JSON.stringify(f)}, which is not a file of the app`,
        );
    return {
      python: build.pip.length > 0 || build.pipFiles.length > 0,
      node: build.npm.length > 0 || (await packageDependencies(dir)),
      pre: build.preBuildCommands,
      post: build.shellCommands,
    };
  }
  if (runtime.kind === "cortex" && runtime.language === "python") {
    const text = await readText(path.join(dir, "requirements.txt"));
    return { python: text !== undefined && hasRequirements(text), node: false, pre: [], post: [] };
  }
  return { python: false, node: await packageDependencies(dir), pre: [], post: [] };
}

/** Whether `file` is a regular file, not through a link at its last part. */
async function regularFile(file: string): Promise<boolean> {
  return lstat(file).then(
    (s) => s.isFile(),
    () => false,
  );
}

/** Lines of each build command's output (its last ones) in the app's log, and the longest line there. */
const DEPLOY_LOG_LINES = 1000;
const DEPLOY_LOG_LINE_CHARS = 16 * 1024;
/**
 * What one deploy writes into the app's log at most, all its commands
 * together: the logs of every app share one stream that drops its oldest
 * lines, so a deploy of 1000 commands of 1000 long lines each would push out
 * every other tenant's logs (replicas' lines are limited per second).
 */
const DEPLOY_LOG_BYTES = 1024 * 1024;
const DEPLOY_LOG_TOTAL_LINES = 10_000;

/** A line of the deploy's output into the app's log, within what the deploy has left; past it, one line says so. */
function deployOutput(c: Context, stream: "stdout" | "stderr", text: string): void {
  const left = c.logLeft;
  if (!c.onOutput || !left || left.cut) return;
  if (left.bytes < text.length || left.lines < 1) {
    left.cut = true;
    c.onOutput(
      "stderr",
      `skiff: the deploy's output past ${DEPLOY_LOG_TOTAL_LINES} lines or ${DEPLOY_LOG_BYTES} bytes is not in the app's log`,
    );
    return;
  }
  left.bytes -= text.length;
  left.lines--;
  c.onOutput(stream, text);
}

/** A step's output into the app's log: the last lines of each stream, each cut, as a replica's are. */
function stepToAppLog(c: Context, r: CommandResult): void {
  for (const [stream, text] of [
    ["stdout", r.stdout],
    ["stderr", r.stderr],
  ] as const)
    for (const line of text
      .split("\n")
      .filter((l) => l !== "")
      .slice(-DEPLOY_LOG_LINES))
      deployOutput(c, stream, line.slice(0, DEPLOY_LOG_LINE_CHARS));
}

/** How much of a failed build command's output its error quotes: its last lines. */
const COMMAND_TAIL_LINES = 20;

/**
 * A step's output as skiff's own log shows it: its last part, unless the
 * build got secrets (`[build] secrets`), whose values the output may hold:
 * then the app's log has it, as a replica's output.
 */
function stepOutput(c: Context, output: string): string {
  return secretsIn(c) ? "(the build had secrets: see the app's log)" : tail(output);
}

/** Whether the build steps got secrets. */
const secretsIn = (c: Context) => c.buildSecrets !== undefined && Object.keys(c.buildSecrets).length > 0;

/**
 * Runs a cerebrium.toml's pre_build_commands or shell_commands in order with
 * /bin/sh -c, in the build's sandbox like the installs (the folder writable
 * at /app, the venv's bin first on PATH when there is one). Their output
 * goes to the runner's log and the app's (onOutput); the first that fails
 * fails the deploy with its exit code and last lines (the tenant's own
 * command, in its own sandbox).
 */
async function runBuildCommands(c: Context, key: string, commands: string[], venvBin: string | undefined) {
  const setting = installSetting(c);
  const env = venvBin ? { ...setting.env, PATH: `${venvBin}:${setting.env.PATH}` } : setting.env;
  for (const [i, command] of commands.entries()) {
    c.logger.info({ dir: c.dir, project: c.project, command }, `running ${key}[${i}]`);
    deployOutput(c, "stdout", `running ${key}[${i}]: ${command.slice(0, 1000)}`);
    const r = await runCommand("/bin/sh", ["-c", command], {
      cwd: setting.cwd,
      env,
      timeoutMs: c.timeoutMs,
      sandbox: step(c, true),
    });
    const output = `${r.stdout}${r.stderr ? `\n${r.stderr}` : ""}`.trim();
    if (output !== "")
      c.logger.info({ dir: c.dir, project: c.project, command, output: stepOutput(c, output) }, `${key}[${i}] output`);
    stepToAppLog(c, r);
    if (r.code !== 0) {
      const last = output.split("\n").slice(-COMMAND_TAIL_LINES).join("\n");
      throw new PrepareFailed(
        `cerebrium.deployment.${key}[${i}] (${JSON.stringify(command.slice(0, 200))}) ${r.code === null ? "did not finish in time" : `exited with ${r.code}`}` +
          (!last ? "" : secretsIn(c) ? "; its output is in the app's log" : `; its last lines:\n${tail(last)}`),
      );
    }
  }
}

/** The build's steps in order: pre_build_commands, the Python and npm installs, shell_commands. Returns the venv's interpreter. */
async function installs(c: Context, config: AppConfig, plan: BuildPlan): Promise<string | undefined> {
  // skiff's own file in the build's .skiff, written before any of the tenant's commands run there: afterwards
  // the folder is the tenant's, and root's open() would follow a link left for .skiff to a host folder.
  const requirements = plan.python ? await requirementFiles(c, config) : [];
  await runBuildCommands(c, "pre_build_commands", plan.pre, undefined);
  const python = plan.python ? await installPython(c, config, requirements) : undefined;
  if (plan.node) await installNode(c, config);
  const venvBin = python && path.posix.join(c.sandbox.enabled ? APP_MOUNT : c.dir, path.dirname(python));
  await runBuildCommands(c, "shell_commands", plan.post, venvBin);
  return python;
}

/** Where dpkg keeps what is installed. */
const DPKG_STATUS = "/var/lib/dpkg/status";

/** The Debian packages installed on this machine, from dpkg's status file (data, read whole, never run). */
async function installedDebianPackages(): Promise<Set<string>> {
  const statusFile = DPKG_STATUS;
  const installed = new Set<string>();
  const st = await lstat(statusFile).catch(() => undefined);
  if (!st?.isFile() || st.size > 256 * 1024 * 1024) return installed;
  const text = await readFile(statusFile, "utf8");
  for (const para of text.split(/\n\s*\n/)) {
    const name = /^Package:\s*(\S+)\s*$/m.exec(para)?.[1];
    const status = /^Status:\s*(.+?)\s*$/m.exec(para)?.[1];
    if (name && status?.endsWith(" installed")) installed.add(name);
  }
  return installed;
}

const PACKAGE_LINE = /^[A-Za-z0-9][A-Za-z0-9.+_-]{0,200}$/;

/** The packages a cerebrium.toml's paths.apt / paths.conda file lists, one a line (# comments); a link is refused. */
async function packagesOfFile(dir: string, rel: string, key: string): Promise<string[]> {
  let text: string;
  try {
    const file = await open(path.join(dir, rel), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      const st = await file.stat();
      if (!st.isFile() || st.size > 1024 * 1024) throw new Error("not a file of at most 1 MiB");
      text = await file.readFile("utf8");
    } finally {
      await file.close();
    }
  } catch {
    throw new PrepareFailed(`${key} names ${JSON.stringify(rel)}, which is not a file of the app`);
  }
  const names: string[] = [];
  for (const [i, raw] of text.split(/\r?\n/).entries()) {
    const line = raw.replace(/#.*$/, "").trim();
    if (line === "") continue;
    const name = line.split(/[\s=<>]/)[0];
    if (!PACKAGE_LINE.test(name)) throw new PrepareFailed(`line ${i + 1} of ${rel} is not a package name`);
    names.push(name);
  }
  return names;
}

/**
 * Refuses an app whose apt or conda packages this machine lacks, naming them:
 * a tenant never installs system packages. A conda package counts as present
 * as the Debian package of its name or python3-<name>.
 */
async function checkMachinePackages(dir: string, config: AppConfig): Promise<void> {
  const build = config.build;
  if (!build) return;
  const apt = [...build.apt];
  for (const f of build.aptFiles) apt.push(...(await packagesOfFile(dir, f, "cerebrium.dependencies.paths.apt")));
  const conda = [...build.conda];
  for (const f of build.condaFiles) conda.push(...(await packagesOfFile(dir, f, "cerebrium.dependencies.paths.conda")));
  if (apt.length === 0 && conda.length === 0) return;
  const installed = await installedDebianPackages();
  const missingApt = apt.filter((p) => !installed.has(p) && !installed.has(p.toLowerCase()));
  const missingConda = conda.filter((p) => {
    const n = p.toLowerCase();
    return !installed.has(n) && !installed.has(`python3-${n}`);
  });
  const parts: string[] = [];
  if (missingApt.length > 0) parts.push(`apt: ${missingApt.join(", ")}`);
  if (missingConda.length > 0) parts.push(`conda: ${missingConda.join(", ")}`);
  if (parts.length > 0)
    throw new PrepareFailed(
      `this machine does not have the system packages the app needs (${parts.join("; ")}). ` +
        "Apps do not install system packages: ask the operator to install them on every runner machine.",
    );
}

/**
 * Runs the build in a build area and replaces the folder with a checked
 * copy of what it left (build-area.ts): the venv's interpreter, if any,
 * and the bytes of the folder's files.
 */
async function buildInArea(
  c: Context,
  config: AppConfig,
  plan: BuildPlan,
): Promise<{ python?: string; bytes: number }> {
  const limits = c.sandbox.build ?? DEFAULT_BUILD_LIMITS;
  return oneBuildAtATime(limits, c.project, async () => {
    const area = await openBuildArea(c.dir, c.uid, limits);
    const out = `${c.dir}.out`;
    try {
      const python = await installs({ ...c, dir: area.dir }, config, plan);
      const bytes = await copyBuildOutput(area.dir, out, limits);
      await rm(c.dir, { recursive: true, force: true });
      await rename(out, c.dir);
      return { python, bytes };
    } finally {
      await area.close();
      await rm(out, { recursive: true, force: true });
    }
  });
}

export interface PrepareOptions {
  timeoutMs?: number;
  sandbox?: SandboxOptions;
  /** The project deploying it: builds take turns by project (oneBuildAtATime). */
  project?: string;
  /** The operator's package index for pip. */
  pip?: PipIndex;
  /** Where a cerebrium.toml's build commands' output goes besides the runner's log: the app's log, line by line. */
  onOutput?: (stream: "stdout" | "stderr", text: string) => void;
  /**
   * The project's secrets as environment variables, for the import check
   * only: it runs the module as a replica does, and a module that reads a
   * secret as it loads (`os.environ["hf_auth_token"]`) finds it. The
   * installs and build commands get only those of `buildSecrets`.
   */
  secrets?: Record<string, string>;
  /** The secrets the app's `[build] secrets` names, for the installs and build commands. */
  buildSecrets?: Record<string, string>;
}

/**
 * Installs the dependencies of the app in `dir` (a folder skiff unpacked)
 * and lists its Cortex functions. In the sandbox, installs run in a build
 * area and `dir` is replaced by a checked copy of what they left
 * (build-area.ts). Throws PrepareFailed with a reason that quotes no file.
 */
export async function prepareDeployment(
  dir: string,
  config: AppConfig,
  logger: Logger,
  opts: PrepareOptions = {},
): Promise<PreparedDeployment> {
  const sandbox = opts.sandbox ?? defaultSandbox();
  const timeoutMs = opts.timeoutMs ?? DEFAULT_INSTALL_TIMEOUT_MS;
  // A uid of the builds' range for this folder (its name is new for each deploy): it owns nothing once the build ends.
  const uid = buildUid(dir);
  const c: Context = {
    dir,
    timeoutMs,
    logger,
    sandbox,
    uid,
    project: opts.project ?? "",
    pip: opts.pip ?? sandbox.pip,
    onOutput: opts.onOutput,
    secrets: opts.secrets,
    buildSecrets: opts.buildSecrets,
    logLeft: { bytes: DEPLOY_LOG_BYTES, lines: DEPLOY_LOG_TOTAL_LINES, cut: false },
  };
  await checkMachinePackages(dir, config);
  if (sandbox.enabled) await settle(dir);
  let python: string | undefined;
  let bytes: number | undefined;
  const plan = await buildPlan(dir, config);
  if (needsBuild(plan)) {
    if (sandbox.enabled) ({ python, bytes } = await buildInArea(c, config, plan));
    else python = await installs(c, config, plan);
  }
  const interpreter = python && path.join(dir, python);
  const built = bytes === undefined ? {} : { bytes };
  // A Custom app's program is looked for as a replica's start looks for it: a misspelt one is said now, not as a
  // 503 to the first call.
  if (config.runtime.kind === "custom" && sandbox.enabled) {
    const program = config.runtime.command[0];
    if (!commandExists(program, dir, programPath(interpreter)))
      throw new PrepareFailed(
        `the app's command ${JSON.stringify(program.slice(0, 200))} is not a program on a replica's PATH (${REPLICA_PATH}${interpreter ? ", after the app's venv" : ""}) nor a file of the app folder`,
      );
  }
  // A Custom app with a venv (a cerebrium.toml's pip dependencies) finds it first on its PATH.
  if (config.runtime.kind !== "cortex") return interpreter === undefined ? built : { ...built, python: interpreter };
  const functions = await listFunctions(c, config, interpreter);
  return interpreter === undefined ? { ...built, functions } : { ...built, functions, python: interpreter };
}
