// What this machine gives sandboxes, decided once and held by one object
// that is passed to where sandboxes start (SandboxOptions.host): where bwrap
// is (SKIFF_BWRAP or the usual places), how the launch script mounts
// read-only folders (an overlay, or a bind where the probe found overlays
// cannot be mounted), the cgroups sandboxes go in (when usable), the ranges
// replicas with outbound network must not reach, and what is computed once
// (the seccomp filter, the base mounts). configureSandbox (sandbox-setup.ts)
// makes the process's; a test or a bench may make its own.
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { DEFAULT_REPLICA_DENIED_CIDRS } from "../config/index.js";
import { detectCgroups, type CgroupLimits, type Cgroups, type SandboxCgroup } from "./cgroups.js";
import { baseMounts, type MountKind } from "./sandbox-argv.js";
import { deniedDestinations } from "./sandbox-network.js";
import { writeSeccompFilter } from "./seccomp.js";

export const BWRAP_CANDIDATES = ["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];

export interface SandboxHostSettings {
  /** SKIFF_BWRAP: where bwrap is; default the first of BWRAP_CANDIDATES that exists. */
  bwrap?: string;
  /** SKIFF_REPLICA_DENIED_CIDRS (default DEFAULT_REPLICA_DENIED_CIDRS). */
  deniedCidrs?: readonly string[];
}

export class SandboxHost {
  /** SKIFF_BWRAP, when set. */
  readonly bwrapSetting: string | undefined;
  readonly deniedCidrs: readonly string[];
  /** How the launch script mounts read-only folders: an overlay, unless configureSandbox's probe found it cannot. */
  mounts: MountKind = "overlay";
  private cgroupsInUse: Cgroups | undefined;
  private cgroupSeq = 0;
  /**
   * Part of each sandbox cgroup's name: the folder `skiff-<pid>-<pid namespace>` is the process's, and two hosts in one process
   * (a gateway's and a runner's, or one after another) must not take each other's `sandbox-<n>`, which can
   * outlive its sandbox for a moment while its processes end.
   */
  private readonly cgroupTag = randomBytes(4).toString("hex");
  private seccomp: Buffer | undefined;
  private base: string[] | undefined;

  constructor(settings: SandboxHostSettings = {}) {
    this.bwrapSetting = settings.bwrap;
    this.deniedCidrs = settings.deniedCidrs ?? DEFAULT_REPLICA_DENIED_CIDRS;
  }

  bwrapPath(): string | undefined {
    if (this.bwrapSetting) return existsSync(this.bwrapSetting) ? this.bwrapSetting : undefined;
    return BWRAP_CANDIDATES.find((p) => existsSync(p));
  }

  /** The cgroups of sandboxes, when enableCgroups found them usable. */
  get cgroups(): Cgroups | undefined {
    return this.cgroupsInUse;
  }

  /** Puts every later sandbox of this host in a memory and pids cgroup of its own; false (and why) when it cannot. */
  enableCgroups(): true | string {
    const found = detectCgroups();
    if (typeof found === "string") return found;
    this.cgroupsInUse = found;
    return true;
  }

  /** A new cgroup for one sandbox with these limits, when cgroups are in use. */
  sandboxCgroup(limits: CgroupLimits): SandboxCgroup | undefined {
    return this.cgroupsInUse?.create(`sandbox-${this.cgroupTag}-${++this.cgroupSeq}`, limits);
  }

  /** The seccomp filter every sandbox stage runs under, written once per host. */
  seccompFilter(): Buffer {
    return (this.seccomp ??= writeSeccompFilter());
  }

  /** The mounts every sandbox has (sandbox-argv.ts baseMounts), read once per host. */
  baseMounts(): readonly string[] {
    return (this.base ??= baseMounts());
  }

  /** The destinations a replica with outbound network must not reach: the host's addresses now and deniedCidrs. */
  deniedDestinations(): string[] {
    return deniedDestinations(this.deniedCidrs);
  }
}
