// The command line of a sandbox (see sandbox.ts): bwrap's options, which it
// reads from a pipe, the launch script that runs it where skiff is root, the
// gate that sets the app's environment last, and the mounts every sandbox
// has. Functions of their arguments only: what the machine decided (how the
// launch script mounts folders, the base mounts once read) is the
// SandboxHost's (sandbox-host.ts).
import { createHash } from "node:crypto";
import { existsSync, lstatSync, readdirSync, readlinkSync, realpathSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

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
  /** CPUs the sandbox's processes may use together (its cgroup's CPU quota); undefined: no quota. */
  cpus?: number;
}

/** A sandbox's network: loopback only, or the outside world through slirp4netns (never the host's loopback). */
export type SandboxNetwork = "none" | "slirp4netns";

/** Where a sandboxed process finds its app folder, working folder and HOME. */
export const APP_MOUNT = "/app";
/** Where a replica finds its project's persistent storage, read-write (project-storage.ts). */
export const STORAGE_MOUNT = "/persistent-storage";
/** Where apps written for the platform the spec documents find their files too (a link to APP_MOUNT). */
const CORTEX_MOUNT = "/cortex";
/** Where the shims are, read-only. */
export const SHIM_MOUNT = "/skiff";
/** The fd on which a sandboxed replica receives the listening socket of its channel. */
export const CHANNEL_FD = 3;

export const SHIM_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), "shims");
export const PRLIMIT = "/usr/bin/prlimit";
export const UNSHARE = "/usr/bin/unshare";
/**
 * Where, in a mount namespace of its own made for each sandbox when skiff is
 * root, the launch script (LAUNCH_SCRIPT) mounts the app's folder and the
 * shims again before bwrap starts: a bind mount shows the path of its source
 * in /proc/self/mountinfo, and these would show the host's data folder and
 * checkout; and bwrap, which runs as the sandbox's uid, reaches them there
 * (the data folder is root's alone).
 */
export const NEUTRAL_DIR = existsSync("/run") ? "/run/skiff-sandbox" : "/tmp/skiff-sandbox";
/** The line the launch script waits for on fd 0 before anything else (see launchInput). */
const LAUNCH_GO = "go";
/**
 * Run as root with a fixed environment by `unshare --mount --propagation
 * private`, with arguments: the app's folder ("" for none), "ro" or "rw",
 * the shims' folder, the sandbox's uid, "overlay" or "bind", the project's
 * persistent storage (a loop device, a folder, or "" for none), then bwrap's
 * command line. It mounts a tmpfs on NEUTRAL_DIR and each folder there: a
 * read-only one through an overlay (whose source and options in mountinfo
 * name only NEUTRAL_DIR) or, where overlays cannot be mounted, a read-only
 * bind; a build's folder (rw), a tmpfs of its own already, bound as it is;
 * the persistent storage's device (project-storage.ts) mounted read-write,
 * or its plain folder bound.
 * Then it drops to the sandbox's uid for good (setpriv: no capability in any
 * set, no_new_privs, no groups) and runs bwrap there, unprivileged, in a user
 * namespace: no stage of the sandbox ever holds a host privilege.
 */
const LAUNCH_SCRIPT = `set -e
# Nothing before the runner's word on fd 0 (launchInput), which it writes once this process is in the
# sandbox's cgroup: everything the script starts is in it. \`read\` is the shell's own and forks nothing.
read -r go && [ "$go" = ${LAUNCH_GO} ] || exit 125
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
if [ -b "$6" ]; then
  mkdir "$n/storage"
  mount -t ext4 -o nosuid,nodev,noatime "$6" "$n/storage"
elif [ -n "$6" ]; then
  mkdir "$n/storage"
  mount --bind "$6" "$n/storage"
fi
u=$4
shift 6
exec /usr/bin/env -i PATH="$PATH" /usr/bin/setpriv --reuid="$u" --regid="$u" --clear-groups \\
  --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"`;

/** How the launch script mounts read-only folders: through an overlay, or (where overlays cannot be mounted) a bind. */
export type MountKind = "overlay" | "bind";
export const SETPRIV = "/usr/bin/setpriv";
/** Sets the app's environment after the drop to its uid: the only stage that sees it. */
const ENV = "/usr/bin/env";
/** The environment of bwrap and of every stage before `env -i`: fixed, nothing of the tenant's. */
export const STAGE_ENV = { PATH: "/usr/bin:/bin" } as const;
const ETC_FILES = [
  // The operator's pip configuration (an index, a mirror): read by deploy-time installs.
  "/etc/pip.conf",
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
export const PROBE_UID = BUILD_UID_BASE + UID_RANGE + 1;

/** The uid of deploy-time steps of one build folder (its name is new for each build); projects' come from uids.ts. */
export const buildUid = (key: string): number =>
  BUILD_UID_BASE + (createHash("sha256").update(key).digest().readUInt32BE(0) % UID_RANGE);

export const runsAsRoot = (): boolean => process.getuid?.() === 0;

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

/** The mounts every sandbox has: system folders, /etc files, runtimes, /proc, /dev (SandboxHost keeps them). */
export function baseMounts(): string[] {
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
  return args;
}

export interface SandboxSpec {
  /** Host folder of the app: bound read-only entry by entry into a tmpfs /app, or whole and writable. */
  appDir: string;
  /** true: deploy-time install, /app is the folder itself, writable. */
  writableApp?: boolean;
  /**
   * The project's persistent storage, read-write at STORAGE_MOUNT: a loop
   * device that the launch script mounts (skiff is root), or a folder bound;
   * none: no storage.
   */
  storage?: string;
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
  // sh exports PWD of its own accord: the app gets its environment only (a shell the app runs sets it again).
  `unset PWD; skiff_text=$(/usr/bin/cat <&${fd}) || exit ${GATE_CLOSED}; eval "$skiff_text"; ` +
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
export function launch(bwrap: string, spec: SandboxSpec, command: string[], mounts: MountKind): [string, string[]] {
  const args = ["--args", "0", ...command];
  if (!runsAsRoot()) return [bwrap, args];
  const script = [spec.appDir, spec.writableApp ? "rw" : "ro", SHIM_DIR, String(spec.uid), mounts, spec.storage ?? ""];
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
 * gate with an empty environment, the app's command. `base` is baseMounts().
 */
export function sandboxArgv(
  spec: SandboxSpec,
  fds: SandboxFds,
  base: readonly string[],
): { options: string[]; command: string[] } {
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
    ...base,
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
  if (spec.storage) options.push("--bind", neutral ? `${NEUTRAL_DIR}/storage` : spec.storage, STORAGE_MOUNT);
  // The app's files are also at /cortex, where apps of cerebrium.toml read them by absolute path.
  options.push("--symlink", APP_MOUNT, CORTEX_MOUNT);
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

/**
 * What the program `launch` gives is fed on fd 0: bwrap's options (`--args
 * 0`), after the line that lets the launch script start where skiff is root.
 * Written only once the spawned process is in the sandbox's cgroup, so that
 * neither the script (whose mounts run as processes of their own) nor bwrap
 * (which reads its options before it forks) starts anything outside it.
 */
export function launchInput(options: string[]): Buffer {
  const args = argsBytes(options);
  return runsAsRoot() ? Buffer.concat([Buffer.from(`${LAUNCH_GO}\n`), args]) : args;
}
