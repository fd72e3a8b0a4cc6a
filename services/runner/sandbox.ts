// The sandbox every replica and every deploy-time step runs in: bubblewrap
// (`bwrap`) with its own mount, pid, ipc, uts and network namespaces.
//
// Inside, a process sees:
//   /usr (and /bin, /lib… as the host has them), a few files of /etc (TLS
//     certificates, resolv.conf, hosts, nsswitch.conf, localtime,
//     alternatives), and the runtimes (node, python3) read-only;
//   /app: its working folder and HOME, a size-limited tmpfs in which every
//     top-level entry of the deployment is bound read-only, so replicas
//     share one unpacked deployment and may still write new files next to
//     it (deploy-time installs get the deployment itself, writable);
//   /tmp: a size-limited tmpfs; /skiff: the shims, read-only;
//   a fresh /proc (only its own processes) and a minimal /dev;
//   a network namespace of its own: only loopback, or (network
//     "slirp4netns") the outside world through slirp4netns with the host's
//     loopback refused; never NATS, skiff's port or another replica on
//     127.0.0.1. Requests come through a Unix socket the runner made and
//     handed over as fd 3.
// It runs as an unprivileged uid of its project (replicas) or of its build
// (deploy-time steps). When skiff runs as root that is a real host uid, and
// bwrap itself runs as it: a launch script (LAUNCH_SCRIPT), in a mount
// namespace of its own, mounts the app's folder and the shims on neutral
// paths and drops to that uid for good (no capability in any set,
// no_new_privs) before bwrap starts, unprivileged, in a user namespace; so
// no stage of a sandbox holds a host privilege. Without root, a user
// namespace maps the sandbox's uid to skiff's own. Every stage runs under a
// seccomp filter (seccomp-filter.py) and /proc/sys is read-only. rlimits
// (`prlimit`) bound its address space, processes, open files, file size and
// CPU time; killing the namespace's first process ends everything inside,
// `setsid` or not.
//
// Nothing the tenant controls reaches a privileged process: the launch
// script and bwrap get a fixed environment and fixed arguments, and the
// app's own environment (its [env]) is set by the gate, after everything
// else; bwrap reads its options from a pipe (--args), so /proc/1/cmdline
// inside says nothing of the host's paths.
//
// The parts: sandbox-argv.ts (bwrap's command line, the launch script, the
// gate), seccomp.ts (the filter), sandbox-network.ts (slirp4netns and the
// refused destinations), cgroups.ts, sandbox-host.ts (what this machine
// gives sandboxes, one explicit object) and sandbox-setup.ts (probing the
// machine at start: configureSandbox). Here: starting and signalling one
// sandbox.

import { spawn, type ChildProcess, type StdioOptions } from "node:child_process";
import { mkdirSync } from "node:fs";
import { constants } from "node:os";
import type { BuildLimits } from "./build-area.js";
import { joinOrKill } from "./cgroups.js";
import {
  launchInput,
  CHANNEL_FD,
  gateText,
  launch,
  NEUTRAL_DIR,
  runsAsRoot,
  sandboxArgv,
  STAGE_ENV,
  type SandboxFds,
  type SandboxLimits,
  type SandboxNetwork,
  type SandboxSpec,
} from "./sandbox-argv.js";
import { SandboxHost } from "./sandbox-host.js";
import { connectOutside, SLIRP_RESOLV_CONF, slirpPath } from "./sandbox-network.js";

export interface SandboxOptions {
  /** False only when SKIFF_SANDBOX=off: processes run as skiff's own children, unconfined. */
  enabled: boolean;
  limits: SandboxLimits;
  /** Default "none". */
  network?: SandboxNetwork;
  /** False: requests to Custom apps always go through their relay (SKIFF_REPLICA_DIRECT=off); default true. */
  direct?: boolean;
  /** What a deploy-time install may leave (build-area.ts); default DEFAULT_BUILD_LIMITS. */
  build?: BuildLimits;
  /** The operator's package index for deploy-time pip installs (SKIFF_PIP_INDEX_URL, SKIFF_PIP_EXTRA_INDEX_URL). */
  pip?: { indexUrl?: string; extraIndexUrls?: string[] };
  /** What this machine gives sandboxes (configureSandbox's, or one of the caller's own). */
  host: SandboxHost;
}

export const DEFAULT_SANDBOX_LIMITS: SandboxLimits = {
  memoryMb: 2048,
  pids: 512,
  fileMb: 100,
  tmpMb: 100,
  cpuSeconds: 0,
  openFiles: 4096,
};

/**
 * Sandboxes on with the default limits and a host of their own with default
 * settings (no cgroups): for a Runner or a preparation given no sandbox
 * (tests, benches); skiff itself passes configureSandbox's.
 */
export const defaultSandbox = (more: Partial<SandboxOptions> = {}): SandboxOptions => ({
  enabled: true,
  limits: DEFAULT_SANDBOX_LIMITS,
  host: new SandboxHost(),
  ...more,
});

export interface SandboxedProcess {
  child: ChildProcess;
  /** Why the sandbox was ended before its command ran, if it was. */
  setupError?: () => string | undefined;
  /** Whether the kernel's OOM killer ended a process of its cgroup (false without one). */
  oomKilled?: () => boolean;
  /** Host pid of the sandbox's first process, once bwrap has said it. */
  initPid: () => number | undefined;
  /** Resolves once bwrap has said the init pid (or has exited). */
  ready: Promise<void>;
}

/** Spawns `spec` in a sandbox on `host`; stdout and stderr are pipes. */
export function spawnSandboxed(host: SandboxHost, spec: SandboxSpec): SandboxedProcess {
  const bwrap = host.bwrapPath();
  if (!bwrap) throw new Error("bwrap (bubblewrap) is not installed");
  const passed = spec.fds ?? [];
  const slirp = spec.network === "slirp4netns" ? slirpPath() : undefined;
  if (spec.network === "slirp4netns" && !slirp) throw new Error("slirp4netns is not installed");
  const filter = host.seccompFilter();
  const cgroup = host.sandboxCgroup({
    memoryBytes: spec.limits.memoryMb * 1024 * 1024,
    // bwrap's own process, which waits outside the sandbox's pid namespace, is in it too (below), and so is
    // slirp4netns (sandbox-network.ts).
    pids: spec.limits.pids + 1 + (slirp ? 1 : 0),
    cpus: spec.limits.cpus,
  });
  // After the command's own fds: the info fd, the seccomp filter, slirp4netns's resolv.conf, the block fd
  // that bwrap waits on (when there is something to set up first), and the gate.
  let next = CHANNEL_FD + passed.length;
  const fds: SandboxFds = { info: next++, seccomp: next++, gate: 0 };
  if (slirp) fds.resolv = next++;
  if (slirp || cgroup) fds.block = next++;
  fds.gate = next;
  const stdio: StdioOptions = ["pipe", "pipe", "pipe", ...passed];
  while (stdio.length <= fds.gate) stdio.push("pipe");
  let child: ChildProcess;
  try {
    const { options, command } = sandboxArgv(spec, fds, host.baseMounts());
    // bwrap reads its options from stdin (--args 0); the command then finds stdin at its end.
    if (runsAsRoot()) mkdirSync(NEUTRAL_DIR, { recursive: true, mode: 0o755 });
    const [program, args] = launch(bwrap, spec, command, host.mounts);
    child = spawn(program, args, { env: STAGE_ENV, stdio, detached: true });
    // Into the cgroup before it can fork: it waits for fd 0 (fed below) before it starts anything (the
    // launch script for its word, bwrap for its options: launchInput), so everything of the sandbox is in
    // it from its first instant, and a runner killed at any point leaves it in a cgroup of a skiff process
    // that is gone, which the next start ends (reapLeftovers). Joined only after bwrap named its first
    // process, a child still waiting for bwrap to write its uid map was left in none when the runner died
    // then, waiting for good.
    // Killed if it cannot join: nothing of the sandbox has started, bwrap still waits for its options.
    const notJoined = cgroup && joinOrKill(cgroup, child);
    if (notJoined) throw new Error(`cannot put the sandbox in its cgroup: ${notJoined}`);
    const feed = (fd: number, data: Buffer | string) => {
      const w = child.stdio[fd] as NodeJS.WritableStream | null;
      w?.on("error", () => undefined);
      w?.end(data);
    };
    feed(0, launchInput(options));
    feed(fds.seccomp, filter);
    if (fds.resolv !== undefined) feed(fds.resolv, SLIRP_RESOLV_CONF);
  } catch (err) {
    void cgroup?.remove();
    throw err;
  }
  let pid: number | undefined;
  let setupError: string | undefined;
  let oomKilled = false;
  if (cgroup)
    child.once("exit", () => {
      oomKilled = cgroup.oomKilled();
      void cgroup.remove();
    });
  const info = child.stdio[fds.info] as NodeJS.ReadableStream | null;
  const ready = new Promise<void>((resolve) => {
    if (!info) return resolve();
    let text = "";
    info.setEncoding("utf8");
    info.on("data", (c: string) => {
      text += c;
      const m = /"child-pid"\s*:\s*(\d+)/.exec(text);
      if (m && pid === undefined) {
        pid = Number(m[1]);
        resolve();
      }
    });
    info.on("end", () => resolve());
    info.on("error", () => resolve());
    child.on("close", () => resolve());
  });
  const sandboxed: SandboxedProcess = {
    child,
    initPid: () => pid,
    ready,
    setupError: () => setupError,
    oomKilled: () => oomKilled || (cgroup !== undefined && child.exitCode === null && cgroup.oomKilled()),
  };
  const block = fds.block === undefined ? null : (child.stdio[fds.block] as NodeJS.WritableStream | null);
  const gate = child.stdio[fds.gate] as NodeJS.WritableStream | null;
  block?.on("error", () => undefined); // bwrap gone before the sandbox was ready
  gate?.on("error", () => undefined);
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    gate?.end(gateText(spec.env));
    block?.end("1");
  };
  if (!block) {
    release();
    return sandboxed;
  }
  // Whatever fails before the command runs ends the sandbox first (bwrap goes on at any byte, or at the
  // end, of the block fd).
  const fail = (why: string) => {
    setupError ??= why;
    if (pid !== undefined) signalSandbox(sandboxed, "SIGKILL");
  };
  void (async () => {
    await ready;
    if (pid === undefined || !slirp) return release();
    await connectOutside(
      slirp,
      pid,
      child,
      () => host.deniedDestinations(),
      { up: release, failed: fail, isUp: () => released },
      cgroup,
    );
  })();
  return sandboxed;
}

/**
 * Signals a sandboxed process: SIGKILL ends the whole sandbox (the kernel
 * kills every process of a pid namespace whose first process dies); other
 * signals go to the session of the sandbox (the command and the children it
 * did not move to sessions of their own).
 */
export function signalSandbox(p: SandboxedProcess, sig: NodeJS.Signals): void {
  const init = p.initPid();
  const tryKill = (pid: number, s: NodeJS.Signals) => {
    try {
      process.kill(pid, s);
    } catch {
      // already gone
    }
  };
  if (sig === "SIGKILL" || init === undefined) {
    if (init !== undefined) tryKill(init, "SIGKILL");
    if (p.child.pid !== undefined) tryKill(-p.child.pid, "SIGKILL");
    return;
  }
  tryKill(-init, sig);
}

/** The signal a bwrap exit code stands for, if any. */
export function exitSignal(code: number | null, signal: NodeJS.Signals | null): string | undefined {
  if (signal) return signal;
  if (code === null || code <= 128) return undefined;
  return Object.entries(constants.signals as Record<string, number>).find(([, n]) => n === code - 128)?.[0];
}
