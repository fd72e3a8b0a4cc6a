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
import { execFileSync, spawn, type ChildProcess, type StdioOptions } from "node:child_process";
import { createHash } from "node:crypto";
import {
  closeSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { readFile } from "node:fs/promises";
import { constants, networkInterfaces, tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { bundleLimits } from "../apps/index.js";
import type { BuildLimits } from "./build-area.js";
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
  /** Open files, sockets, pipes and eventfds per process (RLIMIT_NOFILE). */
  openFiles: number;
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
  /** What a deploy-time install may leave (build-area.ts); default DEFAULT_BUILD_LIMITS. */
  build?: BuildLimits;
}

export const DEFAULT_SANDBOX_LIMITS: SandboxLimits = {
  memoryMb: 2048,
  pids: 512,
  fileMb: 100,
  tmpMb: 100,
  cpuSeconds: 0,
  openFiles: 4096,
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
const UNSHARE = "/usr/bin/unshare";
/**
 * Where, in a mount namespace of its own made for each sandbox when skiff is
 * root, the launch script (LAUNCH_SCRIPT) mounts the app's folder and the
 * shims again before bwrap starts: a bind mount shows the path of its source
 * in /proc/self/mountinfo, and these would show the host's data folder and
 * checkout; and bwrap, which runs as the sandbox's uid, reaches them there
 * (the data folder is root's alone).
 */
const NEUTRAL_DIR = existsSync("/run") ? "/run/skiff-sandbox" : "/tmp/skiff-sandbox";
/**
 * Run as root with a fixed environment by `unshare --mount --propagation
 * private`, with arguments: the app's folder ("" for none), "ro" or "rw",
 * the shims' folder, the sandbox's uid, "overlay" or "bind", then bwrap's
 * command line. It mounts a tmpfs on NEUTRAL_DIR and each folder there: a
 * read-only one through an overlay (whose source and options in mountinfo
 * name only NEUTRAL_DIR) or, where overlays cannot be mounted, a read-only
 * bind; a build's folder (rw), a tmpfs of its own already, bound as it is.
 * Then it drops to the sandbox's uid for good (setpriv: no capability in any
 * set, no_new_privs, no groups) and runs bwrap there, unprivileged, in a user
 * namespace: no stage of the sandbox ever holds a host privilege.
 */
const LAUNCH_SCRIPT = `set -e
n=${NEUTRAL_DIR}
kind=$5
mount -t tmpfs -o mode=0755,size=64k skiff-sandbox "$n"
mkdir "$n/empty" "$n/a" "$n/s" "$n/app" "$n/shims"
# ro FOLDER STAGE TARGET: the folder read-only at TARGET, through STAGE when it is an overlay
ro() {
  if [ "$kind" = overlay ]; then
    mount --bind "$1" "$2"
    mount -t overlay skiff -o ro,lowerdir="$2:$n/empty" "$3"
  else
    mount --bind -o ro "$1" "$3"
  fi
}
ro "$3" "$n/s" "$n/shims"
if [ "$2" = rw ]; then
  mount --bind "$1" "$n/app"
elif [ -n "$1" ]; then
  ro "$1" "$n/a" "$n/app"
fi
u=$4
shift 5
exec /usr/bin/env -i PATH="$PATH" /usr/bin/setpriv --reuid="$u" --regid="$u" --clear-groups \\
  --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"`;

/** How the launch script mounts read-only folders: an overlay, unless configureSandbox's probe found it cannot. */
let neutralKind: "overlay" | "bind" = "overlay";
const IP_CANDIDATES = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];
/** Priority of the namespace's rules that refuse the host's addresses: before the main table's (32766). */
const DENY_RULE_PRIORITY = 100;
const SETPRIV = "/usr/bin/setpriv";
/** Sets the app's environment after the drop to its uid: the only stage that sees it. */
const ENV = "/usr/bin/env";
/** The environment of bwrap and of every stage before `env -i`: fixed, nothing of the tenant's. */
const STAGE_ENV = { PATH: "/usr/bin:/bin" } as const;
/** Debian's interpreter, which has libseccomp's bindings (python3-seccomp), to write the seccomp filter. */
const SECCOMP_PYTHON = "/usr/bin/python3";
const SECCOMP_SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), "seccomp-filter.py");
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
/** Deploy-time steps' uids: a range of UID_RANGE from BUILD_UID_BASE, above the projects' (uids.ts UID_LIMIT). */
const BUILD_UID_BASE = 1_300_000;
const UID_RANGE = 1_000_000;
/** The uid of the probe at start: above the projects' and the builds' ranges, so never one of theirs. */
const PROBE_UID = BUILD_UID_BASE + UID_RANGE + 1;

/** The uid of deploy-time steps of one build folder (its name is new for each build); projects' come from uids.ts. */
export const buildUid = (key: string): number =>
  BUILD_UID_BASE + (createHash("sha256").update(key).digest().readUInt32BE(0) % UID_RANGE);

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

/** The resolv.conf of a sandbox with slirp4netns: its DNS forwarder (the host's may name a loopback resolver). */
const SLIRP_RESOLV_CONF = `nameserver ${SLIRP_DNS}\n`;

let seccompProgram: Buffer | undefined;

/** The seccomp filter every sandbox stage runs under (seccomp-filter.py), written once per process. */
export function seccompFilter(): Buffer {
  if (seccompProgram) return seccompProgram;
  if (!existsSync(SECCOMP_PYTHON)) throw new Error(`${SECCOMP_PYTHON} (Debian's python3) is missing`);
  try {
    seccompProgram = execFileSync(SECCOMP_PYTHON, [SECCOMP_SCRIPT], {
      env: STAGE_ENV,
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 10_000,
    });
  } catch (err) {
    const e = err as { stderr?: Buffer; message: string };
    throw new Error(
      `cannot write the sandbox's seccomp filter (needs Debian's python3-seccomp): ${(e.stderr?.toString() || e.message).trim().slice(-300)}`,
    );
  }
  if (seccompProgram.length === 0 || seccompProgram.length % 8 !== 0)
    throw new Error(`the seccomp filter is not a BPF program (${seccompProgram.length} bytes)`);
  return seccompProgram;
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
  // /proc/sys and /proc/sysrq-trigger read-only: no stage may change the kernel's settings.
  args.push("--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys");
  args.push("--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger");
  args.push("--dev", "/dev");
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
 * The last stage, as the sandbox's uid without capabilities and with an empty
 * environment: it reads the gate fd to its end, a shell text that exports the
 * app's environment and ends with the line that lets the command run
 * (gateText), then runs the command. A text without that line (the runner
 * died before it released the sandbox: bwrap goes on at the end of its block
 * fd as at a byte, and its parent-death signal is not set yet then) ends the
 * sandbox with GATE_CLOSED instead of running the command with no cgroup and
 * no runner.
 */
const gateScript = (fd: number) =>
  `skiff_text=$(/usr/bin/cat <&${fd}) || exit ${GATE_CLOSED}; eval "$skiff_text"; ` +
  `[ "$skiff_gate" = go ] || exit ${GATE_CLOSED}; unset skiff_gate skiff_text; exec ${fd}<&-; exec "$@"`;

/** What the gate reads: the app's environment, quoted as data, then the line that releases the command. */
export function gateText(env: Record<string, string>): string {
  const quote = (v: string) => `'${v.replace(/'/g, `'\\''`)}'`;
  return Object.entries(env)
    .map(([name, value]) => `export ${name}=${quote(value)}\n`)
    .concat("skiff_gate=go\n")
    .join("");
}

/** The fds bwrap is given besides the command's own. */
export interface SandboxFds {
  /** Where bwrap says the init pid. */
  info: number;
  /** The seccomp filter, which bwrap reads. */
  seccomp: number;
  /** The resolv.conf to bind (slirp4netns's), when there is one. */
  resolv?: number;
  /** bwrap waits on it before it runs the command, when there is something to set up first. */
  block?: number;
  /** The gate (gateScript): the app's environment, and the word to run. At most 9 (sh redirects fds 0-9). */
  gate: number;
}

/**
 * The program and arguments that start a sandbox: bwrap itself when skiff is
 * not root (it runs as skiff's uid); else LAUNCH_SCRIPT in a mount namespace
 * of its own, which mounts the folders and drops to the sandbox's uid first.
 */
function launch(bwrap: string, spec: SandboxSpec, command: string[]): [string, string[]] {
  const args = ["--args", "0", ...command];
  if (!runsAsRoot()) return [bwrap, args];
  const script = [spec.appDir, spec.writableApp ? "rw" : "ro", SHIM_DIR, String(spec.uid), neutralKind];
  return [
    UNSHARE,
    [
      "--mount",
      "--propagation",
      "private",
      "--",
      "/bin/sh",
      "-c",
      LAUNCH_SCRIPT,
      "skiff-launch",
      ...script,
      bwrap,
      ...args,
    ],
  ];
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Checks what a spec carries into argv and the environment: the launcher
 * takes only names and values it can pass on as data.
 */
function checkSpec(spec: SandboxSpec, fds: SandboxFds): void {
  const bad = (what: string) => {
    throw new Error(`cannot start a sandbox: ${what}`);
  };
  if (!Number.isInteger(spec.uid) || spec.uid <= 0 || spec.uid >= 2 ** 31) bad(`uid ${spec.uid} is not a sandbox uid`);
  if (spec.command === "") bad("the command is empty");
  for (const text of [spec.command, ...spec.args]) if (text.includes("\0")) bad("an argument contains a NUL byte");
  for (const [name, value] of Object.entries(spec.env)) {
    if (!ENV_NAME.test(name) || name.startsWith("skiff_"))
      bad(`${JSON.stringify(name.slice(0, 80))} is not a variable name`);
    if (value.includes("\0")) bad(`the value of ${name} contains a NUL byte`);
  }
  if (fds.gate > 9) bad(`too many fds (${fds.gate})`);
}

/**
 * bwrap's command line for a spec: its options, which it reads from a pipe
 * (--args) since they hold paths, and the command it runs: `prlimit`, the
 * gate with an empty environment, the app's command.
 */
export function sandboxArgv(spec: SandboxSpec, fds: SandboxFds): { options: string[]; command: string[] } {
  checkSpec(spec, fds);
  const { limits } = spec;
  const mb = (n: number) => String(n * 1024 * 1024);
  const options = [
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
  // Where skiff is root, bwrap binds the folders from where LAUNCH_SCRIPT put them.
  const neutral = runsAsRoot();
  options.push("--ro-bind", neutral ? `${NEUTRAL_DIR}/shims` : SHIM_DIR, SHIM_MOUNT);
  if (spec.writableApp) options.push("--bind", neutral ? `${NEUTRAL_DIR}/app` : spec.appDir, APP_MOUNT);
  else {
    options.push("--perms", "0777", "--size", mb(limits.tmpMb), "--tmpfs", APP_MOUNT);
    for (const name of readdirSync(spec.appDir)) {
      const host = path.join(spec.appDir, name);
      const inside = path.posix.join(APP_MOUNT, name);
      const st = lstatSync(host);
      if (st.isSymbolicLink()) options.push("--symlink", readlinkSync(host), inside);
      else options.push("--ro-bind", neutral ? `${NEUTRAL_DIR}/app/${name}` : host, inside);
    }
  }
  if (fds.resolv !== undefined)
    options.push("--perms", "0444", "--ro-bind-data", String(fds.resolv), "/etc/resolv.conf");
  else if (existsSync("/etc/resolv.conf")) options.push("--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf");
  options.push("--chdir", APP_MOUNT, "--info-fd", String(fds.info), "--seccomp", String(fds.seccomp));
  if (fds.block !== undefined) options.push("--block-fd", String(fds.block));
  const command = [
    PRLIMIT,
    `--as=${mb(limits.memoryMb)}`,
    `--nproc=${limits.pids}`,
    `--fsize=${mb(limits.fileMb)}`,
    `--nofile=${limits.openFiles}`,
    "--core=0",
  ];
  if (limits.cpuSeconds > 0) command.push(`--cpu=${limits.cpuSeconds}`);
  command.push("--");
  // bwrap runs as the sandbox's uid (LAUNCH_SCRIPT dropped to it, or skiff is that uid) and maps it to itself.
  options.unshift("--unshare-user", "--disable-userns", "--uid", String(spec.uid), "--gid", String(spec.uid));
  // Everything runs as the sandbox's uid without capabilities; only the gate sets the app's environment.
  command.push(ENV, "-i", "/bin/sh", "-c", gateScript(fds.gate), "skiff-gate", spec.command, ...spec.args);
  return { options, command };
}

/** The NUL-separated form bwrap reads with --args. */
export const argsBytes = (args: string[]): Buffer => Buffer.from(args.map((a) => `${a}\0`).join(""));

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
  const passed = spec.fds ?? [];
  const slirp = spec.network === "slirp4netns" ? slirpPath() : undefined;
  if (spec.network === "slirp4netns" && !slirp) throw new Error("slirp4netns is not installed");
  const filter = seccompFilter();
  const cgroup = cgroupsInUse?.create(`sandbox-${++cgroupSeq}`, {
    memoryBytes: spec.limits.memoryMb * 1024 * 1024,
    pids: spec.limits.pids,
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
    const { options, command } = sandboxArgv(spec, fds);
    // bwrap reads its options from stdin (--args 0); the command then finds stdin at its end.
    if (runsAsRoot()) mkdirSync(NEUTRAL_DIR, { recursive: true, mode: 0o755 });
    const [program, args] = launch(bwrap, spec, command);
    child = spawn(program, args, { env: STAGE_ENV, stdio, detached: true });
    const feed = (fd: number, data: Buffer | string) => {
      const w = child.stdio[fd] as NodeJS.WritableStream | null;
      w?.on("error", () => undefined);
      w?.end(data);
    };
    feed(0, argsBytes(options));
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
      [
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        // Its own mount namespace with little visible, and a seccomp filter of its own.
        "--enable-sandbox",
        "--enable-seccomp",
        "--ready-fd=3",
        "--exit-fd=4",
        // By path, not pid: given a pid it joins the process's user namespace first, where it may not set up the
        // network namespace (bwrap's own, when bwrap runs as the sandbox's uid).
        "--netns-type=path",
        `/proc/${pid}/ns/net`,
        "tap0",
      ],
      { stdio: ["ignore", "ignore", "ignore", "pipe", "pipe"], env: STAGE_ENV },
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
  for (const tool of [PRLIMIT, ...(runsAsRoot() ? [SETPRIV, UNSHARE] : [])])
    if (!existsSync(tool)) return `${tool} (util-linux) is missing`;
  const spec: SandboxSpec = {
    appDir: SHIM_DIR,
    uid: PROBE_UID,
    limits,
    command: "/bin/sh",
    args: ["-c", `test -r ${SHIM_MOUNT}/cortex.mjs && test "$(id -u)" = "${PROBE_UID}" && echo sandbox-ok`],
    env: { PATH: "/usr/bin:/bin" },
  };
  const opened: number[] = [];
  try {
    // The filter and the gate from files opened and removed at once: a sync spawn has no pipes to write to.
    const dir = mkdtempSync(path.join(tmpdir(), "skiff-probe-"));
    const fileFd = (name: string, data: Buffer | string) => {
      writeFileSync(path.join(dir, name), data, { mode: 0o644 });
      const fd = openSync(path.join(dir, name), "r");
      opened.push(fd);
      return fd;
    };
    const filter = fileFd("seccomp.bpf", seccompFilter());
    const gate = fileFd("gate", gateText(spec.env));
    rmSync(dir, { recursive: true, force: true });
    const fds: SandboxFds = { info: CHANNEL_FD, seccomp: CHANNEL_FD + 1, gate: CHANNEL_FD + 2 };
    const { options, command } = sandboxArgv(spec, fds);
    if (runsAsRoot()) mkdirSync(NEUTRAL_DIR, { recursive: true, mode: 0o755 });
    const [program, args] = launch(bwrap, spec, command);
    const out = execFileSync(program, args, {
      input: argsBytes(options),
      env: STAGE_ENV,
      stdio: ["pipe", "pipe", "pipe", "pipe", filter, gate],
      timeout: 10_000,
    }).toString();
    if (!out.includes("sandbox-ok")) return `the probe sandbox did not run as expected: ${out.trim().slice(0, 200)}`;
  } catch (err) {
    const e = err as { stderr?: Buffer; message: string };
    return `bwrap fails here: ${(e.stderr?.toString() || e.message).trim().slice(0, 300)}`;
  } finally {
    for (const fd of opened) closeSync(fd);
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
  | "sandbox"
  | "replicaMemoryMb"
  | "replicaPids"
  | "replicaFileMb"
  | "replicaTmpMb"
  | "replicaCpuSeconds"
  | "replicaOpenFiles"
> &
  Partial<
    Pick<
      Config,
      | "maxBundleFiles"
      | "maxAppsPerProject"
      | "replicaNetwork"
      | "bwrap"
      | "replicaDeniedCidrs"
      | "replicaDirect"
      | "maxBuildBytes"
      | "maxBuildFiles"
      | "maxConcurrentBuilds"
    >
  >;

/** O_CLOEXEC as /proc/<pid>/fdinfo's `flags` shows it (octal). */
const O_CLOEXEC = 0o2000000;

/**
 * Closes every file descriptor this process inherited without close-on-exec
 * (all of Node's own have it): a child process gets every such descriptor,
 * and bwrap passes them on to the app, so a file or pipe of whatever started
 * skiff would reach every tenant. Standard input, output and error, and
 * Node's IPC channel, stay. Gives back what it closed.
 */
export function closeInheritedFds(): { fd: number; target: string }[] {
  const keep = new Set([0, 1, 2]);
  if (process.env.NODE_CHANNEL_FD) keep.add(Number(process.env.NODE_CHANNEL_FD));
  const closed: { fd: number; target: string }[] = [];
  let names: string[];
  try {
    names = readdirSync("/proc/self/fd");
  } catch {
    return closed; // not Linux
  }
  for (const name of names) {
    const fd = Number(name);
    if (keep.has(fd)) continue;
    let flags: number;
    let target: string;
    try {
      const info = readFileSync(`/proc/self/fdinfo/${fd}`, "utf8");
      flags = parseInt(/^flags:\s+([0-7]+)$/m.exec(info)?.[1] ?? "0", 8);
      target = readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      continue; // the listing's own descriptor, gone by now
    }
    if (flags & O_CLOEXEC) continue;
    try {
      closeSync(fd);
      closed.push({ fd, target });
    } catch {
      // already closed
    }
  }
  return closed;
}

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
    openFiles: settings.replicaOpenFiles,
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
  const inherited = closeInheritedFds();
  if (inherited.length > 0)
    logger.warn(
      { fds: inherited },
      "closed file descriptors this process inherited without close-on-exec: they would have reached every app",
    );
  let failure = probeSandbox(limits);
  if (failure && runsAsRoot()) {
    neutralKind = "bind";
    if (probeSandbox(limits)) neutralKind = "overlay";
    else {
      logger.warn(
        { overlay: false, why: failure },
        "sandboxes bind the app's folder and the shims read-only without an overlay: overlays cannot be mounted " +
          "here, so apps can read where the data folder and the checkout are (/proc/self/mountinfo), not what they hold",
      );
      failure = undefined;
    }
  }
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
  const build =
    settings.maxBuildBytes !== undefined && settings.maxBuildFiles !== undefined
      ? {
          maxBytes: settings.maxBuildBytes,
          maxFiles: settings.maxBuildFiles,
          concurrent: settings.maxConcurrentBuilds ?? 2,
        }
      : undefined;
  processDefault = { enabled: true, limits, network, direct: settings.replicaDirect !== "off", build };
  logger.info(
    { sandbox: "on", hostUid: runsAsRoot(), network, cgroup: cgroupsInUse?.version ?? null, ...limits },
    `apps run in a bubblewrap sandbox (own namespaces, read-only deployment, rlimits${cgroupsInUse ? `, a cgroup v${cgroupsInUse.version} each` : ""})`,
  );
  return processDefault;
}
