// The `skiff` command as a user runs it: bin/skiff.js in a process of its
// own, with PATH and HOME and only the environment the test gives.
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";

export const SKIFF_BIN = path.resolve(import.meta.dirname, "..", "..", "bin", "skiff.js");

export interface CliOptions {
  /** SKIFF_* and other variables, on top of PATH and HOME. */
  env?: Record<string, string>;
  /** Default: the test process's own working folder. */
  cwd?: string;
  /** Written to stdin, which is then closed (closed at once without it). */
  input?: string;
}

export interface CliResult {
  /** The exit code; 1 when a signal ended the process. */
  code: number;
  stdout: string;
  stderr: string;
}

/** Starts the CLI and leaves it running, for commands such as `logs --follow`; stdout and stderr are pipes. */
export function spawnCli(args: string[], opts: CliOptions = {}): ChildProcess {
  return spawn(process.execPath, [SKIFF_BIN, ...args], {
    cwd: opts.cwd,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, ...opts.env },
  });
}

/** Runs the CLI to its end. */
export function runCli(args: string[], opts: CliOptions = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawnCli(args, opts);
    let stdout = "";
    let stderr = "";
    child.stdout!.setEncoding("utf8").on("data", (c: string) => (stdout += c));
    child.stderr!.setEncoding("utf8").on("data", (c: string) => (stderr += c));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code: code ?? 1, stdout, stderr }));
    // The result is the exit code; a process that quit before reading its input is no error here.
    child.stdin!.on("error", () => undefined);
    child.stdin!.end(opts.input);
  });
}
