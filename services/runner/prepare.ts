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
// Installs run with installEnv(): the machine's package settings, none of
// the platform's own variables.
import { spawn } from "node:child_process";
import { readFile, rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { AppConfig } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { PrepareFailed } from "../runs/index.js";
import { installEnv, replicaEnv } from "./replica-env.js";
import type { PreparedDeployment } from "./types.js";

export const SHIM_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), "shims");
export const PYTHON_SHIM = path.join(SHIM_DIR, "cortex.py");
export const NODE_SHIM = path.join(SHIM_DIR, "cortex.mjs");
/** The system interpreter, found on the replica PATH. */
export const SYSTEM_PYTHON = "python3";
export const DEFAULT_INSTALL_TIMEOUT_MS = 10 * 60_000;
/** How much of a failed command's output an error message quotes. */
const TAIL_CHARS = 2000;

export interface CommandResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a command to its end, in its own process group so a timeout kills all of it. */
export function runCommand(
  command: string,
  args: string[],
  opts: { cwd: string; env: Record<string, string>; timeoutMs: number },
): Promise<CommandResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      cwd: opts.cwd,
      env: opts.env,
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (c: string) => (stdout = (stdout + c).slice(-1_000_000)));
    child.stderr.setEncoding("utf8").on("data", (c: string) => (stderr = (stderr + c).slice(-1_000_000)));
    const timer = setTimeout(() => {
      stderr += `\n(stopped after ${opts.timeoutMs} ms)`;
      if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL");
    }, opts.timeoutMs);
    child.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
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

async function installNode(dir: string, timeoutMs: number, logger: Logger): Promise<void> {
  const text = await readText(path.join(dir, "package.json"));
  if (text === undefined) return;
  let pkg: { dependencies?: Record<string, string> };
  try {
    pkg = JSON.parse(text) as typeof pkg;
  } catch (err) {
    throw new PrepareFailed(`package.json is not valid JSON: ${(err as Error).message}`, { cause: err });
  }
  if (Object.keys(pkg.dependencies ?? {}).length === 0) return;
  const ci = await exists(path.join(dir, "package-lock.json"));
  const args = [ci ? "ci" : "install", "--omit=dev", "--no-audit", "--no-fund", "--install-links"];
  logger.info({ dir, command: `npm ${args.join(" ")}` }, "installing the app's npm dependencies");
  const r = await runCommand("npm", args, { cwd: dir, env: installEnv(), timeoutMs });
  if (r.code !== 0) throw new PrepareFailed(`npm ${args[0]} failed for package.json:\n${tail(r.stderr || r.stdout)}`);
}

/** pip's ERROR lines, which say what failed; its retry warnings only repeat themselves. */
function pipErrors(output: string): string {
  const errors = output.split("\n").filter((l) => l.startsWith("ERROR:"));
  return errors.length > 0 ? errors.join("\n") : tail(output);
}

/** True when requirements.txt names at least one requirement. */
function hasRequirements(text: string): boolean {
  return text.split(/\r?\n/).some((l) => l.replace(/#.*$/, "").trim() !== "");
}

async function installPython(dir: string, timeoutMs: number, logger: Logger): Promise<string | undefined> {
  const text = await readText(path.join(dir, "requirements.txt"));
  if (text === undefined || !hasRequirements(text)) return undefined;
  const venv = path.join(dir, ".skiff", "venv");
  const env = installEnv();
  logger.info({ dir }, "installing the app's requirements.txt into a venv");
  const made = await runCommand(SYSTEM_PYTHON, ["-m", "venv", venv], { cwd: dir, env, timeoutMs });
  if (made.code !== 0)
    throw new PrepareFailed(
      `could not create a Python venv for requirements.txt:\n${tail(made.stderr || made.stdout)}`,
    );
  const python = path.join(venv, "bin", "python");
  const pip = await runCommand(
    python,
    ["-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-r", "requirements.txt"],
    { cwd: dir, env, timeoutMs },
  );
  if (pip.code !== 0) {
    await rm(venv, { recursive: true, force: true });
    throw new PrepareFailed(
      `could not install requirements.txt: no reachable package index provides them (pip exited with ${pip.code}). ` +
        `Vendor the packages into the app folder, or make a package index reachable from the runner.\n${pipErrors(pip.stderr || pip.stdout)}`,
    );
  }
  return python;
}

/** Runs a shim in --list mode: the public functions, as the replica will serve them. */
async function listFunctions(
  dir: string,
  config: AppConfig,
  python: string | undefined,
  timeoutMs: number,
): Promise<string[]> {
  if (config.runtime.kind !== "cortex") return [];
  const { language, entry } = config.runtime;
  const [command, args] =
    language === "python"
      ? [python ?? SYSTEM_PYTHON, ["-u", PYTHON_SHIM, "--list", entry]]
      : [process.execPath, [NODE_SHIM, "--list", entry]];
  const r = await runCommand(command, args, { cwd: dir, env: replicaEnv(config.env, dir, 0), timeoutMs });
  const last = r.stdout.trimEnd().split("\n").pop() ?? "";
  if (r.code === 0) {
    try {
      const names = JSON.parse(last) as unknown;
      if (Array.isArray(names) && names.every((n) => typeof n === "string")) return names as string[];
    } catch {
      // reported below with the output
    }
  }
  throw new PrepareFailed(`cannot load ${entry}:\n${tail(r.stderr || r.stdout)}`);
}

/**
 * Installs the dependencies of the app in `dir` and lists its Cortex
 * functions. Throws PrepareFailed with the installer's own words.
 */
export async function prepareDeployment(
  dir: string,
  config: AppConfig,
  logger: Logger,
  opts: { timeoutMs?: number } = {},
): Promise<PreparedDeployment> {
  const timeoutMs = opts.timeoutMs ?? DEFAULT_INSTALL_TIMEOUT_MS;
  const { runtime } = config;
  if (runtime.kind === "cortex" && runtime.language === "python") {
    const python = await installPython(dir, timeoutMs, logger);
    const functions = await listFunctions(dir, config, python, timeoutMs);
    return python === undefined ? { functions } : { functions, python };
  }
  await installNode(dir, timeoutMs, logger);
  if (runtime.kind === "custom") return {};
  return { functions: await listFunctions(dir, config, undefined, timeoutMs) };
}
