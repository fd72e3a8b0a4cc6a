// Probing what this machine can do for sandboxes, at start: bwrap (with an
// overlay, else a bind, for read-only folders where skiff is root),
// slirp4netns and the tools that refuse the host's addresses, cgroups; and
// the file descriptors this process inherited, closed before any sandbox
// could get them. configureSandbox gives the process's SandboxOptions, with
// its SandboxHost.
import { execFileSync } from "node:child_process";
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Config } from "../config/index.js";
import { reapLeftovers, type WarnLogger } from "./cgroups.js";
import {
  launchInput,
  CHANNEL_FD,
  gateText,
  launch,
  NEUTRAL_DIR,
  PRLIMIT,
  PROBE_UID,
  runsAsRoot,
  sandboxArgv,
  SETPRIV,
  SHIM_DIR,
  SHIM_MOUNT,
  STAGE_ENV,
  UNSHARE,
  type SandboxFds,
  type SandboxLimits,
  type SandboxNetwork,
  type SandboxSpec,
} from "./sandbox-argv.js";
import { BWRAP_CANDIDATES, SandboxHost } from "./sandbox-host.js";
import { denyToolsPresent, slirpPath } from "./sandbox-network.js";
import type { SandboxOptions } from "./sandbox.js";

/** Why a sandbox probe failed, or undefined when bwrap works on `host` with these settings. */
export function probeSandbox(host: SandboxHost, limits: SandboxLimits): string | undefined {
  const bwrap = host.bwrapPath();
  if (!bwrap && host.bwrapSetting) return `SKIFF_BWRAP names ${host.bwrapSetting}, which does not exist`;
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
    const filter = fileFd("seccomp.bpf", host.seccompFilter());
    const gate = fileFd("gate", gateText(spec.env));
    rmSync(dir, { recursive: true, force: true });
    const fds: SandboxFds = { info: CHANNEL_FD, seccomp: CHANNEL_FD + 1, gate: CHANNEL_FD + 2 };
    const { options, command } = sandboxArgv(spec, fds, host.baseMounts());
    if (runsAsRoot()) mkdirSync(NEUTRAL_DIR, { recursive: true, mode: 0o755 });
    const [program, args] = launch(bwrap, spec, command, host.mounts);
    const out = execFileSync(program, args, {
      input: launchInput(options),
      env: STAGE_ENV,
      stdio: ["pipe", "pipe", "pipe", "pipe", filter, gate],
      timeout: 10_000,
    }).toString();
    if (!out.includes("sandbox-ok")) return `the probe sandbox did not run as expected: ${out.trim().slice(0, 200)}`;
  } catch (err) {
    return `bwrap fails here: ${probeFailure(err as ProbeError)}`;
  } finally {
    for (const fd of opened) closeSync(fd);
  }
  return undefined;
}

type ProbeError = { stderr?: Buffer; status?: number | null; signal?: string | null; code?: string; message: string };

/**
 * What the probe's failure says, on one line: what bwrap printed, else how it ended (an exec error's message
 * names the whole command line, a shell script over several lines).
 */
function probeFailure(e: ProbeError): string {
  return howProbeEnded(e).replace(/\s+/g, " ").slice(0, 300);
}

function howProbeEnded(e: ProbeError): string {
  const said = e.stderr?.toString().trim();
  if (said) return said;
  if (e.code === "ETIMEDOUT") return "it did not finish within 10 s";
  if (typeof e.status === "number") return `it exited with code ${e.status} and printed nothing`;
  if (e.signal) return `it was ended by ${e.signal}`;
  return e.message.split("\n")[0]!;
}

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
      | "replicaNetwork"
      | "bwrap"
      | "replicaDeniedCidrs"
      | "replicaDirect"
      | "maxBuildBytes"
      | "maxBuildFiles"
      | "maxConcurrentBuilds"
      | "pipIndexUrl"
      | "pipExtraIndexUrls"
    >
  >;

/** The operator's package index for deploy-time pip installs, from its settings. */
const pipOf = (settings: SandboxSettings): SandboxOptions["pip"] =>
  settings.pipIndexUrl !== undefined || (settings.pipExtraIndexUrls?.length ?? 0) > 0
    ? { indexUrl: settings.pipIndexUrl, extraIndexUrls: settings.pipExtraIndexUrls }
    : undefined;

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
 * Checks that this host can sandbox apps with these settings and gives the
 * sandbox options of this process, with the SandboxHost it found (and sets
 * the bundle limits). Throws when it cannot and SKIFF_SANDBOX is not off;
 * says loudly when it is off.
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
  const host = new SandboxHost({ bwrap: settings.bwrap, deniedCidrs: settings.replicaDeniedCidrs });
  const wanted = settings.replicaNetwork ?? "none";
  let network: SandboxNetwork = wanted === "auto" ? (slirpPath() ? "slirp4netns" : "none") : wanted;
  if (settings.sandbox === "off") {
    logger.warn(
      { sandbox: "off" },
      "SKIFF_SANDBOX=off: DEPLOYED APPS RUN UNCONFINED as skiff's own user and can read skiff's data folder, " +
        "its environment and other apps, and reach NATS. Only for code you trust.",
    );
    return { enabled: false, limits, network: "none", host, pip: pipOf(settings) };
  }
  const inherited = closeInheritedFds();
  // Done, nothing left to act on (npm and some shells leave such descriptors open): said, not warned of.
  if (inherited.length > 0)
    logger.info(
      { fds: inherited },
      "closed the file descriptors this process inherited open (from npm or a shell), so that no app gets them",
    );
  let failure = probeSandbox(host, limits);
  if (failure && runsAsRoot()) {
    host.mounts = "bind";
    if (probeSandbox(host, limits)) host.mounts = "overlay";
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
  if (network === "slirp4netns" && !denyToolsPresent())
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
  const cgroups = host.enableCgroups();
  if (cgroups !== true)
    logger.warn(
      { cgroups: cgroups },
      "no cgroup per replica here: a replica's memory is bounded per process (RLIMIT_AS) and its processes per " +
        "project uid (RLIMIT_NPROC), not in total (see docs/security.md)",
    );
  // Sandboxes and cgroups of skiff processes that are gone: ended and removed now, in the background (cgroups.ts).
  if (host.cgroups)
    void reapLeftovers(
      host.cgroups.parents.map((p) => path.dirname(p)),
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
  logger.info(
    { sandbox: "on", hostUid: runsAsRoot(), network, cgroup: host.cgroups?.version ?? null, ...limits },
    `apps run in a bubblewrap sandbox (own namespaces, read-only deployment, rlimits${host.cgroups ? `, a cgroup v${host.cgroups.version} each` : ""})`,
  );
  return {
    enabled: true,
    limits,
    network,
    direct: settings.replicaDirect !== "off",
    build,
    host,
    pip: pipOf(settings),
  };
}
