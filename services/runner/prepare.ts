// Readies an unpacked app folder once per deployment, before any replica
// starts: installs its dependencies and, for a Cortex app, lists its public
// functions so that unknown names are refused without starting a replica.
//
//   Cortex Node and Custom: package.json with dependencies → `npm ci` (with
//         package-lock.json) or `npm install`, production dependencies only,
//         into node_modules/.
//   Cortex Python: requirements.txt with requirements → a venv in
//         .skiff/venv and `pip install -r requirements.txt`; PrepareFailed
//         when no package index can provide them. (A Custom Python app
//         vendors its packages: its command runs with the replica PATH.)
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
import { chmod, lstat, readdir, readFile, rename, rm } from "node:fs/promises";
import path from "node:path";
import type { AppConfig } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { PrepareFailed } from "../runs/index.js";
import { copyBuildOutput, DEFAULT_BUILD_LIMITS, oneBuildAtATime, openBuildArea } from "./build-area.js";
import { installEnv, replicaEnv } from "./replica-env.js";
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

async function exists(file: string): Promise<boolean> {
  return (await readText(file)) !== undefined;
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
}

/** Where an install runs: in the folder, with installEnv(). */
const installSetting = (c: Context) => ({ cwd: c.dir, env: installEnv() });

/** `npm ci` (with a lock file) or `npm install` of the production dependencies. */
async function installNode(c: Context): Promise<void> {
  const ci = await exists(path.join(c.dir, "package-lock.json"));
  const args = [ci ? "ci" : "install", "--omit=dev", "--no-audit", "--no-fund", "--install-links"];
  c.logger.info({ dir: c.dir, command: `npm ${args.join(" ")}` }, "installing the app's npm dependencies");
  const r = await runCommand("npm", args, { ...installSetting(c), timeoutMs: c.timeoutMs, sandbox: step(c, true) });
  if (r.code !== 0) {
    c.logger.warn({ dir: c.dir, output: tail(r.stderr || r.stdout) }, `npm ${args[0]} failed`);
    const code = /^npm (?:ERR!|error) code ([A-Z][A-Z0-9_]{1,40})$/m.exec(r.stderr)?.[1];
    throw new PrepareFailed(
      `npm ${args[0]} failed for package.json (${ended(r, "npm")}${code ? `, code ${code}` : ""})`,
    );
  }
}

/** Requirement names pip found no distribution for, as the app wrote them (checked to be requirement-shaped). */
function missingRequirements(output: string): string[] {
  const names: string[] = [];
  for (const m of output.matchAll(/No matching distribution found for ([^\n]{1,200})/g)) {
    const req = m[1].trim();
    if (/^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]*\])?\s*([<>=!~]=?=?\s*[A-Za-z0-9.*+!_-]+\s*,?\s*)*$/.test(req))
      names.push(req);
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

/** Installs requirements.txt into a venv in `.skiff/venv`; its interpreter, relative to the folder. */
async function installPython(c: Context): Promise<string> {
  const venvRel = path.join(".skiff", "venv");
  const venv = path.join(c.dir, venvRel);
  // In the sandbox the folder is /app: the venv works wherever the folder is bound later.
  const venvSeen = c.sandbox.enabled ? path.posix.join(APP_MOUNT, venvRel) : venv;
  const setting = installSetting(c);
  c.logger.info({ dir: c.dir }, "installing the app's requirements.txt into a venv");
  const made = await runCommand(SYSTEM_PYTHON, ["-m", "venv", venvSeen], {
    ...setting,
    timeoutMs: c.timeoutMs,
    sandbox: step(c, true),
  });
  if (made.code !== 0) {
    c.logger.warn({ dir: c.dir, output: tail(made.stderr || made.stdout) }, "python -m venv failed");
    throw new PrepareFailed(`could not create a Python venv for requirements.txt (${ended(made, "python -m venv")})`);
  }
  const pip = await runCommand(
    path.posix.join(venvSeen, "bin", "python"),
    ["-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-r", "requirements.txt"],
    { ...setting, timeoutMs: c.timeoutMs, sandbox: step(c, true) },
  );
  if (pip.code !== 0) {
    const output = pip.stderr + "\n" + pip.stdout;
    c.logger.warn({ dir: c.dir, output: tail(output) }, "pip install -r requirements.txt failed");
    const missing = missingRequirements(output);
    if (missing.length > 0)
      throw new PrepareFailed(
        `could not install requirements.txt: no reachable package index provides them (${ended(pip, "pip")}). ` +
          `Vendor the packages into the app folder, or make a package index reachable from the runner.\n` +
          `Not found: ${missing.join(", ")}`,
      );
    const line = /\(from line (\d+) of requirements\.txt\)/.exec(output)?.[1];
    throw new PrepareFailed(
      `could not install requirements.txt (${ended(pip, "pip")})` +
        (line ? `: line ${line} of requirements.txt cannot be installed as written` : "") +
        ". A requirements file may name packages and options, not files outside the app folder.",
    );
  }
  return path.join(venvRel, "bin", "python");
}

/** Why a module did not load, from the shim's last line: its error's type, code and app file:line only. */
function loadFailure(entry: string, stdoutLast: string, r: CommandResult): PrepareFailed {
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
  if (!type)
    return new PrepareFailed(`cannot load ${entry}:\nthe module did not load (${ended(r, "the import check")})`);
  const known: Record<string, string> = {
    ERR_MODULE_NOT_FOUND: "Cannot find module (an import names a file or package the app does not have)",
    ModuleNotFoundError: "Cannot find module (an import names a module the app does not have)",
  };
  const what = known[code ?? type] ?? "raised while the module was imported";
  return new PrepareFailed(
    `cannot load ${entry}:\n${type}${code ? ` [${code}]` : ""}: ${what}${where ? ` at ${where}` : ""}`,
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
    env: replicaEnv(config.env, sandboxed ? APP_MOUNT : c.dir, 0),
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
  c.logger.warn({ dir: c.dir, entry, output: tail(r.stderr || r.stdout) }, `cannot load ${entry}`);
  throw loadFailure(entry, last, r);
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

/** Whether the app has dependencies to install: a requirements.txt (Cortex Python) or package.json ones. */
async function hasDependencies(dir: string, config: AppConfig): Promise<boolean> {
  const { runtime } = config;
  if (runtime.kind === "cortex" && runtime.language === "python") {
    const text = await readText(path.join(dir, "requirements.txt"));
    return text !== undefined && hasRequirements(text);
  }
  const text = await readText(path.join(dir, "package.json"));
  if (text === undefined) return false;
  try {
    const pkg = JSON.parse(text) as { dependencies?: Record<string, string> };
    return Object.keys(pkg.dependencies ?? {}).length > 0;
  } catch {
    throw new PrepareFailed("package.json is not valid JSON");
  }
}

const installs = (c: Context, config: AppConfig): Promise<string | undefined> =>
  config.runtime.kind === "cortex" && config.runtime.language === "python"
    ? installPython(c)
    : installNode(c).then(() => undefined);

/**
 * Runs the installs in a build area and replaces the folder with a checked
 * copy of what they left (build-area.ts): the venv's interpreter, if any,
 * and the bytes of the folder's files.
 */
async function buildInArea(c: Context, config: AppConfig): Promise<{ python?: string; bytes: number }> {
  const limits = c.sandbox.build ?? DEFAULT_BUILD_LIMITS;
  return oneBuildAtATime(limits, c.project, async () => {
    const area = await openBuildArea(c.dir, c.uid, limits);
    const out = `${c.dir}.out`;
    try {
      const python = await installs({ ...c, dir: area.dir }, config);
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
  const c: Context = { dir, timeoutMs, logger, sandbox, uid, project: opts.project ?? "" };
  if (sandbox.enabled) await settle(dir);
  let python: string | undefined;
  let bytes: number | undefined;
  if (await hasDependencies(dir, config)) {
    if (sandbox.enabled) ({ python, bytes } = await buildInArea(c, config));
    else python = await installs(c, config);
  }
  const interpreter = python && path.join(dir, python);
  const built = bytes === undefined ? {} : { bytes };
  if (config.runtime.kind !== "cortex") return built;
  const functions = await listFunctions(c, config, interpreter);
  return interpreter === undefined ? { ...built, functions } : { ...built, functions, python: interpreter };
}
