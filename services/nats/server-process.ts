// Runs a local `nats-server` as a child process: find the binary, start it,
// learn its client URL, stop it. connectNats uses this when no NATS server is
// configured or answering, and the test helper uses it too, so tests exercise
// the same start and stop path as production.
//
// Readiness comes from the server's ports file (`ports_file_dir`): nats-server
// writes `<binary>_<pid>.ports` once its client listener is up, which happens
// after JetStream is enabled. With port -1 the server picks a free port itself,
// so there is no window in which another process can take a port we chose.
//
// A server must not outlive the process that started it, and two servers must
// never share a store: on Linux the server is started through util-linux
// `setpriv --pdeathsig TERM`, so the kernel tells it to stop (it shuts down
// cleanly on SIGTERM) when its parent dies, even by SIGKILL; and before a
// start, any nats-server still running on the same folder (left by an older
// version, started in the instant before its parent died, or stuck in its
// shutdown) is stopped.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { constants } from "node:fs";
import { access, readdir, readFile, rm, stat } from "node:fs/promises";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import type { Logger } from "../config/index.js";
import { NatsStartError, messageOf } from "./errors.js";

export const NATS_SERVER_BINARY = "nats-server";
const DEFAULT_READY_TIMEOUT_MS = 10_000;
const DEFAULT_STOP_TIMEOUT_MS = 5_000;
const READY_POLL_MS = 5;
const LOG_TAIL_LINES = 20;
const LEFTOVER_POLL_MS = 20;

interface SpawnNatsServerOptions {
  binary: string;
  /** Must make the server write its ports file into `portsDir` (`--ports_file_dir` or `ports_file_dir`). */
  args: string[];
  /** The server's own folder: a nats-server whose arguments name a path in it (its config, its store) is
   * taken to use its store, and is stopped before this one starts. */
  portsDir: string;
  readyTimeoutMs?: number;
  /** Receives each line the server logs (it logs to stderr). */
  onLog?: (line: string) => void;
  /** Told when a leftover server on `portsDir` is stopped. */
  logger?: Logger;
}

export interface NatsServerProcess {
  readonly pid: number;
  /** Client URL from the ports file, e.g. nats://127.0.0.1:41234. */
  readonly url: string;
  readonly port: number;
  /** Resolves once the process has exited, however that happened. */
  readonly exited: Promise<void>;
  /** SIGTERM, then SIGKILL if it is still running after `timeoutMs`. */
  stop(timeoutMs?: number): Promise<void>;
  /** SIGKILL: a crash, as far as the server and its clients can tell. */
  kill(): Promise<void>;
}

/** The first executable file called `name` in the folders of `searchPath` (PATH syntax). */
export async function findOnPath(
  name: string,
  searchPath: string = process.env.PATH ?? "",
): Promise<string | undefined> {
  for (const dir of searchPath.split(path.delimiter)) {
    if (dir === "") continue;
    const candidate = path.join(dir, name);
    try {
      await access(candidate, constants.X_OK);
      if ((await stat(candidate)).isFile()) return candidate;
    } catch {
      // not here; try the next folder
    }
  }
  return undefined;
}

export async function spawnNatsServer(opts: SpawnNatsServerOptions): Promise<NatsServerProcess> {
  await stopLeftovers(path.resolve(opts.portsDir), opts.logger);
  // Their servers are gone: a ports file left by one that was killed names a port anyone may listen on now.
  await removePortsFiles(path.resolve(opts.portsDir));
  // setpriv sets the signal, then execs the server in its own place, so child.pid is the server's pid.
  const setpriv = await setprivWithPdeathsig();
  // A process group of its own: Ctrl-C in a terminal signals skiff's group, and the server must outlive skiff's
  // stop, which still writes to it (it stops the server last); it still ends with skiff (the death signal).
  const child =
    setpriv === undefined
      ? spawn(opts.binary, opts.args, { stdio: ["ignore", "ignore", "pipe"], detached: true })
      : spawn(setpriv, ["--pdeathsig", "TERM", "--", opts.binary, ...opts.args], {
          stdio: ["ignore", "ignore", "pipe"],
          detached: true,
        });
  const log = collectLog(child, opts.onLog);
  let running = true;
  const exited = new Promise<void>((resolve) =>
    child.once("exit", () => {
      running = false;
      untrack(child);
      resolve();
    }),
  );
  await spawned(child, opts.binary);
  track(child);
  const pid = child.pid as number;

  let url: string;
  try {
    url = await waitForPortsFile(opts.portsDir, pid, () => running, opts.readyTimeoutMs ?? DEFAULT_READY_TIMEOUT_MS);
  } catch (err) {
    await terminate(child, exited, DEFAULT_STOP_TIMEOUT_MS);
    throw new NatsStartError(`${messageOf(err)}; its last log lines:\n${log.tail()}`, { cause: err });
  }

  return {
    pid,
    url,
    port: Number(new URL(url).port),
    exited,
    stop: (timeoutMs = DEFAULT_STOP_TIMEOUT_MS) => terminate(child, exited, timeoutMs),
    kill: async () => {
      if (running) child.kill("SIGKILL");
      await exited;
    },
  };
}

/** Resolves once the process runs; rejects when it could not be started at all (ENOENT, EACCES). */
function spawned(child: ChildProcess, binary: string): Promise<void> {
  return new Promise((resolve, reject) => {
    child.once("spawn", resolve);
    child.once("error", (err) => reject(new NatsStartError(`cannot run ${binary}: ${err.message}`, { cause: err })));
  });
}

async function waitForPortsFile(dir: string, pid: number, running: () => boolean, timeoutMs: number): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  const suffix = `_${pid}.ports`;
  while (Date.now() < deadline) {
    if (!running()) throw new Error(`nats-server (pid ${pid}) exited before it was ready`);
    const url = await readPortsFile(dir, suffix);
    if (url !== undefined) return url;
    await sleep(READY_POLL_MS);
  }
  throw new Error(`nats-server (pid ${pid}) was not ready after ${timeoutMs} ms`);
}

async function readPortsFile(dir: string, suffix: string): Promise<string | undefined> {
  const name = (await readdir(dir).catch(() => [] as string[])).find((n) => n.endsWith(suffix));
  if (name === undefined) return undefined;
  try {
    const ports = JSON.parse(await readFile(path.join(dir, name), "utf8")) as { nats?: string[] };
    return ports.nats?.[0];
  } catch {
    // caught while the server was still writing it; the next poll reads it whole
    return undefined;
  }
}

async function terminate(child: ChildProcess, exited: Promise<void>, timeoutMs: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill("SIGTERM");
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(true), timeoutMs);
  });
  const late = await Promise.race([exited.then(() => false), timedOut]);
  clearTimeout(timer);
  if (late) child.kill("SIGKILL");
  await exited;
}

/** Forwards the server's log lines and keeps the last few for error messages. The pipe must be
 * read continuously: a full pipe would block the server. */
function collectLog(child: ChildProcess, onLog?: (line: string) => void): { tail(): string } {
  const lines: string[] = [];
  let partial = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => {
    const parts = (partial + chunk).split("\n");
    partial = parts.pop() ?? "";
    for (const line of parts) {
      onLog?.(line);
      lines.push(line);
      if (lines.length > LOG_TAIL_LINES) lines.shift();
    }
  });
  return { tail: () => [...lines, partial].filter((l) => l !== "").join("\n") };
}

let setprivFound: Promise<string | undefined> | undefined;
/** util-linux setpriv, if it is on the PATH and knows --pdeathsig (2.33 and later); looked up once. */
function setprivWithPdeathsig(): Promise<string | undefined> {
  setprivFound ??= (async () => {
    if (process.platform !== "linux") return undefined;
    const setpriv = await findOnPath("setpriv");
    if (setpriv === undefined) return undefined;
    const help = await promisify(execFile)(setpriv, ["--help"]).catch(() => ({ stdout: "" }));
    return help.stdout.includes("--pdeathsig") ? setpriv : undefined;
  })();
  return setprivFound;
}

/** Stops every nats-server running on `dir` (SIGTERM, then SIGKILL), so that a new one is alone on its store. */
async function stopLeftovers(dir: string, logger: Logger | undefined): Promise<void> {
  for (const pid of await serversUsing(dir)) {
    for (const signal of ["SIGTERM", "SIGKILL"] as const) {
      try {
        process.kill(pid, signal);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ESRCH") break;
        const why = messageOf(err);
        throw new NatsStartError(`a nats-server (pid ${pid}) already runs on ${dir}; stopping it failed: ${why}`, {
          cause: err,
        });
      }
      const deadline = Date.now() + DEFAULT_STOP_TIMEOUT_MS;
      while (Date.now() < deadline && (await usesFolder(pid, dir))) await sleep(LEFTOVER_POLL_MS);
      if (!(await usesFolder(pid, dir))) break;
    }
    if (await usesFolder(pid, dir)) {
      throw new NatsStartError(`a nats-server (pid ${pid}) already runs on ${dir} and did not stop on SIGKILL`);
    }
    logger?.warn(
      { serverPid: pid, storeDir: dir },
      `stopped a leftover nats-server (pid ${pid}) on ${dir}: a second server on the same store would corrupt it`,
    );
  }
}

/** The nats-server processes (as /proc shows them; none where there is no /proc) using `dir`. */
async function serversUsing(dir: string): Promise<number[]> {
  const pids = (await readdir("/proc").catch(() => [] as string[])).filter((n) => /^\d+$/.test(n)).map(Number);
  const using = await Promise.all(pids.map((pid) => usesFolder(pid, dir)));
  return pids.filter((_, i) => using[i]);
}

/** Removes the ports files in `dir` (`<binary>_<pid>.ports`), once no server runs on it. */
async function removePortsFiles(dir: string): Promise<void> {
  for (const name of await readdir(dir).catch(() => [] as string[]))
    if (/^nats-server_\d+\.ports$/.test(name)) await rm(path.join(dir, name), { force: true });
}

/** Whether `pid` runs nats-server with an argument (a config file, a store, `--opt=path`) in `dir`. Checked on the
 * command line itself, so a pid reused by another program never matches; a zombie's is empty. */
async function usesFolder(pid: number, dir: string): Promise<boolean> {
  const argv = (await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).split("\0");
  if (path.basename(argv[0]) !== NATS_SERVER_BINARY) return false;
  return argv.slice(1).some((arg) => {
    const value = arg.startsWith("-") && arg.includes("=") ? arg.slice(arg.indexOf("=") + 1) : arg;
    const resolved = path.resolve(value);
    return path.isAbsolute(value) && (resolved === dir || resolved.startsWith(dir + path.sep));
  });
}

// Servers still running when this process exits are told to stop, so none
// outlives the process that started it; where setpriv is missing, this is all
// that does. One listener serves them all.
const live = new Set<ChildProcess>();
function stopAllOnExit(): void {
  for (const child of live) child.kill("SIGTERM");
}
function track(child: ChildProcess): void {
  if (child.exitCode !== null || child.signalCode !== null) return;
  if (live.size === 0) process.on("exit", stopAllOnExit);
  live.add(child);
}
function untrack(child: ChildProcess): void {
  if (!live.delete(child)) return;
  if (live.size === 0) process.off("exit", stopAllOnExit);
}
