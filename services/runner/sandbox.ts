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
// It runs as an unprivileged uid derived from its project (replicas) or
// its bundle (deploy-time steps). When skiff runs as root that is a real
// host uid (bwrap keeps CAP_SETUID/CAP_SETGID only long enough for
// `setpriv` to drop to it, with no_new_privs); otherwise a user namespace
// maps it to skiff's own uid. rlimits (`prlimit`) bound its address space,
// processes, file size and CPU time; killing the namespace's first process
// ends everything inside, `setsid` or not.
import { execFileSync, spawn, type ChildProcess, type StdioOptions } from "node:child_process";
import { createHash } from "node:crypto";
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdtempSync,
  readdirSync,
  readlinkSync,
  realpathSync,
  writeFileSync,
} from "node:fs";
import { readFile } from "node:fs/promises";
import { constants, networkInterfaces, tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { bundleLimits } from "../apps/index.js";
import { detectCgroups, reapLeftovers, type Cgroups, type WarnLogger } from "./cgroups.js";
import { DEFAULT_REPLICA_DENIED_CIDRS, type Config } from "../config/index.js";

export interface SandboxLimits {
  /** Address space per process (RLIMIT_AS), MiB. */
  memoryMb: number;
  /** Processes and threads of the sandbox's uid (RLIMIT_NPROC). */
  pids: number;
  /** Largest file it may write (RLIMIT_FSIZE), MiB. */
  fileMb: number;
  /** Size of each of its tmpfs folders, /app and /tmp, MiB. */
  tmpMb: number;
  /** CPU seconds per process (RLIMIT_CPU); 0: no limit. */
  cpuSeconds: number;
}

/** A sandbox's network: loopback only, or the outside world through slirp4netns (never the host's loopback). */
export type SandboxNetwork = "none" | "slirp4netns";

export interface SandboxOptions {
  /** False only when SKIFF_SANDBOX=off: processes run as skiff's own children, unconfined. */
  enabled: boolean;
  limits: SandboxLimits;
  /** Default "none". */
  network?: SandboxNetwork;
  /** False: requests to Custom apps always go through their relay (SKIFF_REPLICA_DIRECT=off); default true. */
  direct?: boolean;
}

export const DEFAULT_SANDBOX_LIMITS: SandboxLimits = {
  memoryMb: 2048,
  pids: 512,
  fileMb: 100,
  tmpMb: 100,
  cpuSeconds: 0,
};

export const DEFAULT_SANDBOX: SandboxOptions = { enabled: true, limits: DEFAULT_SANDBOX_LIMITS };

/** Where a sandboxed process finds its app folder, working folder and HOME. */
export const APP_MOUNT = "/app";
/** Where the shims are, read-only. */
export const SHIM_MOUNT = "/skiff";
/** The fd on which a sandboxed replica receives the listening socket of its channel. */
export const CHANNEL_FD = 3;

export const SHIM_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), "shims");
const BWRAP_CANDIDATES = ["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];
const PRLIMIT = "/usr/bin/prlimit";
const SLIRP_CANDIDATES = ["/usr/bin/slirp4netns", "/usr/local/bin/slirp4netns"];
/** The DNS forwarder slirp4netns offers inside the namespace. */
const SLIRP_DNS = "10.0.2.3";
const NSENTER_CANDIDATES = ["/usr/bin/nsenter", "/bin/nsenter"];
const IP_CANDIDATES = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];
/** Priority of the namespace's rules that refuse the host's addresses: before the main table's (32766). */
const DENY_RULE_PRIORITY = 100;
const SETPRIV = "/usr/bin/setpriv";
const ETC_FILES = [
  "/etc/ssl",
  "/etc/ca-certificates",
  "/etc/ca-certificates.conf",
  "/etc/resolv.conf",
  "/etc/hosts",
  "/etc/nsswitch.conf",
  "/etc/localtime",
  "/etc/alternatives",
  "/etc/ld.so.cache",
  "/etc/ld.so.conf",
  "/etc/ld.so.conf.d",
  "/etc/mime.types",
  "/etc/python3",
  "/etc/python3.11",
];
/** Sandbox uids: replicas from PROJECT_UID_BASE, deploy-time steps from BUILD_UID_BASE, each a range of UID_RANGE. */
const PROJECT_UID_BASE = 200_000;
const BUILD_UID_BASE = 1_300_000;
const UID_RANGE = 1_000_000;

function uidOf(base: number, key: string): number {
  return base + (createHash("sha256").update(key).digest().readUInt32BE(0) % UID_RANGE);
}

/** The uid (and gid) of a project's replicas. */
export const projectUid = (projectId: string): number => uidOf(PROJECT_UID_BASE, projectId);
/** The uid of deploy-time steps of one deployment folder. */
export const buildUid = (key: string): number => uidOf(BUILD_UID_BASE, key);

export const runsAsRoot = (): boolean => process.getuid?.() === 0;

/** SKIFF_BWRAP, when set (configureSandbox). */
let bwrapSetting: string | undefined;

export function bwrapPath(): string | undefined {
  if (bwrapSetting) return existsSync(bwrapSetting) ? bwrapSetting : undefined;
  return BWRAP_CANDIDATES.find((p) => existsSync(p));
}

export function slirpPath(): string | undefined {
  return SLIRP_CANDIDATES.find((p) => existsSync(p));
}

/** The cgroups of sandboxes, when configureSandbox found them usable (or enableCgroups was called). */
let cgroupsInUse: Cgroups | undefined;
let cgroupSeq = 0;

/** Puts every later sandbox of this process in a memory and pids cgroup of its own; false (and why) when it cannot. */
export function enableCgroups(): true | string {
  const found = detectCgroups();
  if (typeof found === "string") return found;
  cgroupsInUse = found;
  return true;
}

/** SKIFF_REPLICA_DENIED_CIDRS, set by configureSandbox. */
let deniedCidrs: string[] = DEFAULT_REPLICA_DENIED_CIDRS;

/**
 * The destinations a replica with outbound network must not reach: every
 * IPv4 address the host has now (slirp4netns connects from the host's own
 * stack, where a service bound to 0.0.0.0 or to one of them would answer;
 * the host's loopback is refused by slirp4netns itself) and the configured
 * ranges. slirp4netns runs without IPv6, so a replica has no IPv6 route out.
 */
export function deniedDestinations(): string[] {
  const own = Object.values(networkInterfaces())
    .flat()
    .filter((a) => a !== undefined && a.family === "IPv4" && !a.address.startsWith("127."))
    .map((a) => `${a!.address}/32`);
  return [...new Set([...own, ...deniedCidrs])];
}

const findTool = (candidates: string[]) => candidates.find((p) => existsSync(p));

/**
 * Adds, from outside, rules to the network namespace of `pid` that refuse
 * (EACCES) every denied destination, before anything of the app runs there.
 * The app cannot take them out: it has no CAP_NET_ADMIN over that namespace
 * (a host uid without capabilities when skiff is root; otherwise a user
 * namespace in which bwrap dropped every capability, with no nested ones).
 */
function denyDestinations(pid: number): Promise<void> {
  const nsenter = findTool(NSENTER_CANDIDATES);
  const ip = findTool(IP_CANDIDATES);
  if (!nsenter || !ip) return Promise.reject(new Error("nsenter (util-linux) or ip (iproute2) is missing"));
  const ns = (kind: string) => `--${kind}=/proc/${pid}/ns/${kind === "user" ? "user" : "net"}`;
  const args = runsAsRoot() ? [ns("net")] : ["--preserve-credentials", ns("user"), ns("net")];
  const batch = deniedDestinations()
    .map((cidr) => `rule add prohibit to ${cidr} priority ${DENY_RULE_PRIORITY}\n`)
    .join("");
  return new Promise((resolve, reject) => {
    const p = spawn(nsenter, [...args, ip, "-batch", "-"], { stdio: ["pipe", "ignore", "pipe"] });
    let stderr = "";
    p.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
    p.on("error", reject);
    p.on("close", (code) =>
      code === 0 ? resolve() : reject(new Error(`cannot keep the replica off the host's addresses: ${stderr.trim()}`)),
    );
    p.stdin!.on("error", () => undefined);
    p.stdin!.end(batch);
  });
}

let slirpResolv: string | undefined;

/** A resolv.conf naming slirp4netns's DNS forwarder, written once (the host's may name a loopback resolver). */
function slirpResolvConf(): string {
  if (slirpResolv) return slirpResolv;
  const dir = mkdtempSync(path.join(tmpdir(), "skiff-sandbox-"));
  const file = path.join(dir, "resolv.conf");
  writeFileSync(file, `nameserver ${SLIRP_DNS}\n`, { mode: 0o644 });
  chmodSync(dir, 0o755);
  return (slirpResolv = file);
}

/** The runtime folders outside /usr that sandboxes need read-only: node's and python3's prefixes. */
function runtimeMounts(): string[] {
  const out = new Set<string>();
  const add = (binary: string | undefined) => {
    if (!binary) return;
    let real: string;
    try {
      real = realpathSync(binary);
    } catch {
      return;
    }
    if (real.startsWith("/usr/")) return;
    out.add(path.dirname(path.dirname(real)));
  };
  add(process.execPath);
  for (const dir of ["/usr/local/bin", "/usr/bin", "/bin"]) {
    const p = path.join(dir, "python3");
    if (existsSync(p)) {
      add(p);
      break;
    }
  }
  return [...out];
}

let cachedBase: string[] | undefined;

/** The mounts every sandbox has: system folders, /etc files, runtimes, /proc, /dev, shims. */
function baseMounts(): string[] {
  if (cachedBase) return cachedBase;
  const args: string[] = ["--ro-bind", "/usr", "/usr"];
  for (const top of ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]) {
    let st;
    try {
      st = lstatSync(top);
    } catch {
      continue;
    }
    if (st.isSymbolicLink()) args.push("--symlink", readlinkSync(top), top);
    else if (st.isDirectory()) args.push("--ro-bind", top, top);
  }
  // bwrap makes missing parents 0700 (as root): make them readable first.
  const made = new Set<string>();
  const parents = (p: string) => {
    const chain: string[] = [];
    for (let d = path.dirname(p); d !== "/" && !made.has(d); d = path.dirname(d)) chain.unshift(d);
    for (const d of chain) {
      made.add(d);
      args.push("--perms", "0755", "--dir", d);
    }
  };
  // resolv.conf is per network (see sandboxArgv).
  for (const p of [...ETC_FILES.filter((f) => existsSync(f) && f !== "/etc/resolv.conf"), ...runtimeMounts()]) {
    parents(p);
    args.push("--ro-bind", p, p);
  }
  args.push("--proc", "/proc", "--dev", "/dev", "--ro-bind", SHIM_DIR, SHIM_MOUNT);
  cachedBase = args;
  return args;
}

export interface SandboxSpec {
  /** Host folder of the app: bound read-only entry by entry into a tmpfs /app, or whole and writable. */
  appDir: string;
  /** true: deploy-time install, /app is the folder itself, writable. */
  writableApp?: boolean;
  uid: number;
  limits: SandboxLimits;
  command: string;
  args: string[];
  env: Record<string, string>;
  /** Extra fds for the sandboxed command, from fd 3 on (the channel). */
  fds?: number[];
  network?: SandboxNetwork;
}

/** The exit status of a sandbox whose runner was gone before it released it. */
const GATE_CLOSED = 125;
/**
 * What runs the command once the sandbox is released: a line on the gate fd
 * lets it run; the end of the fd with no line (the runner died before it
 * released the sandbox) ends the sandbox with GATE_CLOSED instead. bwrap goes
 * on at the end of its block fd as at a byte, and its parent-death signal is
 * not set yet then, so without the gate the command would run with no cgroup
 * and no runner.
 */
const gateScript = (fd: number) => `read -r go <&${fd} || exit ${GATE_CLOSED}; exec ${fd}<&-; exec "$@"`;

/**
 * The bwrap command line for a spec; the info fd is the one after the passed
 * fds. With a block fd (a cgroup to join, or slirp4netns to set up), bwrap
 * waits on it, and the command on the gate fd after it (gateScript).
 */
export function sandboxArgv(spec: SandboxSpec, infoFd: number, blockFd?: number): string[] {
  const { limits } = spec;
  const mb = (n: number) => String(n * 1024 * 1024);
  const args = [
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-net",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--new-session",
    "--hostname",
    "app",
    ...baseMounts(),
    "--perms",
    "1777",
    "--size",
    mb(limits.tmpMb),
    "--tmpfs",
    "/tmp",
  ];
  if (spec.writableApp) args.push("--bind", spec.appDir, APP_MOUNT);
  else {
    args.push("--perms", "0777", "--size", mb(limits.tmpMb), "--tmpfs", APP_MOUNT);
    for (const name of readdirSync(spec.appDir)) {
      const host = path.join(spec.appDir, name);
      const inside = path.posix.join(APP_MOUNT, name);
      const st = lstatSync(host);
      if (st.isSymbolicLink()) args.push("--symlink", readlinkSync(host), inside);
      else args.push("--ro-bind", host, inside);
    }
  }
  if (spec.network === "slirp4netns") args.push("--ro-bind", slirpResolvConf(), "/etc/resolv.conf");
  else if (existsSync("/etc/resolv.conf")) args.push("--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf");
  args.push("--chdir", APP_MOUNT, "--info-fd", String(infoFd));
  if (blockFd !== undefined) args.push("--block-fd", String(blockFd));
  const limit = [
    PRLIMIT,
    `--as=${mb(limits.memoryMb)}`,
    `--nproc=${limits.pids}`,
    `--fsize=${mb(limits.fileMb)}`,
    "--core=0",
  ];
  if (limits.cpuSeconds > 0) limit.push(`--cpu=${limits.cpuSeconds}`);
  limit.push("--");
  if (runsAsRoot()) {
    // A real unprivileged host uid: bwrap keeps only what setpriv needs to drop to it.
    args.push("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--");
    args.push(...limit, SETPRIV, `--reuid=${spec.uid}`, `--regid=${spec.uid}`, "--clear-groups", "--no-new-privs");
    args.push("--inh-caps=-all", "--");
  } else {
    args.splice(0, 0, "--unshare-user", "--disable-userns", "--uid", String(spec.uid), "--gid", String(spec.uid));
    args.push("--", ...limit);
  }
  if (blockFd !== undefined) {
    const gateFd = blockFd + 1;
    if (gateFd > 9) throw new Error(`too many fds for a sandbox (${gateFd})`); // sh redirects fds 0-9
    args.push("/bin/sh", "-c", gateScript(gateFd), "skiff-gate");
  }
  args.push(spec.command, ...spec.args);
  return args;
}

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

/**
 * Waits (up to a second) until bwrap has set up the loopback of the
 * namespace of `pid`: slirp4netns configuring it at the same time makes
 * bwrap's own setup fail.
 */
async function loopbackUp(pid: number): Promise<void> {
  const read = (name: string) => readFile(`/proc/${pid}/net/${name}`, "utf8").catch(() => undefined);
  const deadline = Date.now() + 1000;
  while (Date.now() < deadline) {
    const v4 = (await read("fib_trie"))?.includes("127.0.0.1");
    const v6 = await read("if_inet6");
    // With IPv6, lo has ::1 once it is up, bwrap's last step; without, the address is the sign.
    if (v4 && (v6 === undefined || / lo$/m.test(v6))) return;
    await new Promise((r) => setTimeout(r, 1));
  }
}

/** Spawns `spec` in a sandbox; stdout and stderr are pipes. */
export function spawnSandboxed(spec: SandboxSpec): SandboxedProcess {
  const bwrap = bwrapPath();
  if (!bwrap) throw new Error("bwrap (bubblewrap) is not installed");
  const fds = spec.fds ?? [];
  const infoFd = CHANNEL_FD + fds.length;
  const slirp = spec.network === "slirp4netns" ? slirpPath() : undefined;
  if (spec.network === "slirp4netns" && !slirp) throw new Error("slirp4netns is not installed");
  const cgroup = cgroupsInUse?.create(`sandbox-${++cgroupSeq}`, {
    memoryBytes: spec.limits.memoryMb * 1024 * 1024,
    pids: spec.limits.pids,
  });
  // bwrap waits on the block fd, when there is one, before it runs the command, and the command on the gate fd.
  const blockFd = slirp || cgroup ? infoFd + 1 : undefined;
  const gated = blockFd ? (["pipe", "pipe"] as const) : [];
  const stdio: StdioOptions = ["ignore", "pipe", "pipe", ...fds, "pipe", ...gated];
  let child: ChildProcess;
  try {
    child = spawn(bwrap, sandboxArgv(spec, infoFd, blockFd), { env: spec.env, stdio, detached: true });
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
  const info = child.stdio[infoFd] as NodeJS.ReadableStream | null;
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
  if (blockFd === undefined) return sandboxed;
  const block = child.stdio[blockFd] as NodeJS.WritableStream | null;
  const gate = child.stdio[blockFd + 1] as NodeJS.WritableStream | null;
  block?.on("error", () => undefined); // bwrap gone before the sandbox was ready
  gate?.on("error", () => undefined);
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    gate?.end("go\n");
    block?.end("1");
  };
  // Whatever fails before the command runs ends the sandbox first (bwrap goes on at any byte, or at the
  // end, of the block fd).
  const fail = (why: string) => {
    setupError ??= why;
    if (pid !== undefined) signalSandbox(sandboxed, "SIGKILL");
  };
  void (async () => {
    await ready;
    if (pid === undefined) return release();
    if (cgroup) {
      // Its first process, which forks the command only once released: everything the command starts is in it.
      try {
        cgroup.join(pid);
      } catch (err) {
        return fail(`cannot put the sandbox in its cgroup: ${(err as Error).message}`);
      }
    }
    if (!slirp) return release();
    await loopbackUp(pid);
    // slirp4netns gives the namespace a tap device with a route out (not to the host's loopback). It exits
    // when its exit fd closes: when the sandbox ends, or when this process does.
    const net = spawn(
      slirp,
      ["--configure", "--mtu=65520", "--disable-host-loopback", "--ready-fd=3", "--exit-fd=4", String(pid), "tap0"],
      { stdio: ["ignore", "ignore", "ignore", "pipe", "pipe"] },
    );
    const exitPipe = net.stdio[4] as NodeJS.WritableStream;
    exitPipe.on("error", () => undefined);
    const stopNet = () => {
      exitPipe.end();
      if (net.exitCode === null) net.kill("SIGTERM");
    };
    if (child.exitCode !== null || child.signalCode !== null) stopNet();
    else child.on("exit", stopNet);
    const netFailed = (why: string) => {
      stopNet();
      fail(why);
    };
    net.on("error", (err) => netFailed(`slirp4netns: ${err.message}`));
    net.on("exit", () => {
      if (!released) netFailed("slirp4netns ended before the network was up");
    });
    // Until the host's own addresses are refused in the namespace, the command does not run.
    (net.stdio[3] as NodeJS.ReadableStream).once("data", () => {
      denyDestinations(pid!).then(release, (err: Error) => netFailed(err.message));
    });
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

/** Why a sandbox probe failed, or undefined when bwrap works here with these settings. */
export function probeSandbox(limits: SandboxLimits): string | undefined {
  const bwrap = bwrapPath();
  if (!bwrap && bwrapSetting) return `SKIFF_BWRAP names ${bwrapSetting}, which does not exist`;
  if (!bwrap) return `bwrap (Debian package bubblewrap) is not installed (looked for ${BWRAP_CANDIDATES.join(", ")})`;
  for (const tool of [PRLIMIT, ...(runsAsRoot() ? [SETPRIV] : [])])
    if (!existsSync(tool)) return `${tool} (util-linux) is missing`;
  const spec: SandboxSpec = {
    appDir: SHIM_DIR,
    uid: projectUid("probe"),
    limits,
    command: "/bin/sh",
    args: ["-c", `test -r ${SHIM_MOUNT}/cortex.mjs && test "$(id -u)" = "${projectUid("probe")}" && echo sandbox-ok`],
    env: { PATH: "/usr/bin:/bin" },
  };
  try {
    const out = execFileSync(bwrap, sandboxArgv(spec, CHANNEL_FD), {
      env: spec.env,
      stdio: ["ignore", "pipe", "pipe", "pipe"],
      timeout: 10_000,
    }).toString();
    if (!out.includes("sandbox-ok")) return `the probe sandbox did not run as expected: ${out.trim().slice(0, 200)}`;
  } catch (err) {
    const e = err as { stderr?: Buffer; message: string };
    return `bwrap fails here: ${(e.stderr?.toString() || e.message).trim().slice(0, 300)}`;
  }
  return undefined;
}

let processDefault: SandboxOptions = DEFAULT_SANDBOX;

/** The sandbox settings of this process (configureSandbox's), used where no other is passed. */
export const processSandbox = (): SandboxOptions => processDefault;

/**
 * The settings of the same names (config.ts says what each means); the
 * bundle limits apply here too, since the same roles (runner, management)
 * unpack bundles.
 */
export type SandboxSettings = Pick<
  Config,
  "sandbox" | "replicaMemoryMb" | "replicaPids" | "replicaFileMb" | "replicaTmpMb" | "replicaCpuSeconds"
> &
  Partial<
    Pick<
      Config,
      "maxBundleFiles" | "maxAppsPerProject" | "replicaNetwork" | "bwrap" | "replicaDeniedCidrs" | "replicaDirect"
    >
  >;

/**
 * Checks that this host can sandbox apps with these settings and makes them
 * this process's default (with the bundle limits). Throws when it cannot and SKIFF_SANDBOX is not
 * off; says loudly when it is off.
 */
export function configureSandbox(settings: SandboxSettings, logger: WarnLogger): SandboxOptions {
  const limits: SandboxLimits = {
    memoryMb: settings.replicaMemoryMb,
    pids: settings.replicaPids,
    fileMb: settings.replicaFileMb,
    tmpMb: settings.replicaTmpMb,
    cpuSeconds: settings.replicaCpuSeconds,
  };
  if (settings.maxBundleFiles !== undefined) bundleLimits.maxFiles = settings.maxBundleFiles;
  if (settings.maxAppsPerProject !== undefined) bundleLimits.maxAppsPerProject = settings.maxAppsPerProject;
  bwrapSetting = settings.bwrap;
  deniedCidrs = settings.replicaDeniedCidrs ?? DEFAULT_REPLICA_DENIED_CIDRS;
  const wanted = settings.replicaNetwork ?? "none";
  let network: SandboxNetwork = wanted === "auto" ? (slirpPath() ? "slirp4netns" : "none") : wanted;
  if (settings.sandbox === "off") {
    logger.warn(
      { sandbox: "off" },
      "SKIFF_SANDBOX=off: DEPLOYED APPS RUN UNCONFINED as skiff's own user and can read skiff's data folder, " +
        "its environment and other apps, and reach NATS. Only for code you trust.",
    );
    processDefault = { enabled: false, limits, network: "none" };
    return processDefault;
  }
  const failure = probeSandbox(limits);
  if (failure)
    throw new Error(
      `cannot sandbox apps on this host: ${failure}. Install bubblewrap (apt-get install bubblewrap) and util-linux ` +
        "(or set SKIFF_BWRAP to where bwrap is), or set SKIFF_SANDBOX=off to run apps unconfined (never for untrusted code).",
    );
  if (network === "slirp4netns" && !slirpPath()) {
    if (wanted === "slirp4netns")
      throw new Error(
        "SKIFF_REPLICA_NETWORK=slirp4netns, but slirp4netns is not installed (apt-get install slirp4netns)",
      );
    network = "none";
  }
  if (network === "slirp4netns" && !runsAsRoot()) {
    // Without root the sandbox's first process sits in a nested user namespace (bwrap --disable-userns) that
    // does not own its network namespace: neither slirp4netns nor skiff's refusal rules can join it from there.
    const why = "slirp4netns needs skiff to run as root here (a sandbox without root has nested user namespaces off)";
    if (wanted === "slirp4netns") throw new Error(`SKIFF_REPLICA_NETWORK=slirp4netns: ${why}`);
    logger.warn({ network: "none" }, `no outbound network for replicas: ${why}`);
    network = "none";
  }
  if (network === "slirp4netns" && (!findTool(NSENTER_CANDIDATES) || !findTool(IP_CANDIDATES)))
    throw new Error(
      "replicas would reach the host's own addresses: slirp4netns needs nsenter (util-linux) and ip (iproute2) to " +
        "refuse them; install them (apt-get install util-linux iproute2), or set SKIFF_REPLICA_NETWORK=none",
    );
  if (network === "none")
    logger.warn(
      { network },
      "replicas and dependency installs have no network (loopback only): apps cannot call outside APIs and " +
        "dependencies must be vendored. Install slirp4netns (SKIFF_REPLICA_NETWORK=auto) to give them the outside world.",
    );
  const cgroups = enableCgroups();
  if (cgroups !== true)
    logger.warn(
      { cgroups: cgroups },
      "no cgroup per replica here: a replica's memory is bounded per process (RLIMIT_AS) and its processes per " +
        "project uid (RLIMIT_NPROC), not in total (see docs/security.md)",
    );
  // Sandboxes and cgroups of skiff processes that are gone: ended and removed now, in the background (cgroups.ts).
  if (cgroupsInUse)
    void reapLeftovers(
      cgroupsInUse.parents.map((p) => path.dirname(p)),
      logger,
    );
  processDefault = { enabled: true, limits, network, direct: settings.replicaDirect !== "off" };
  logger.info(
    { sandbox: "on", hostUid: runsAsRoot(), network, cgroup: cgroupsInUse?.version ?? null, ...limits },
    `apps run in a bubblewrap sandbox (own namespaces, read-only deployment, rlimits${cgroupsInUse ? `, a cgroup v${cgroupsInUse.version} each` : ""})`,
  );
  return processDefault;
}
