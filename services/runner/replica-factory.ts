// The replicas of one deployment version as processes: the command each runs
// (sandboxed: the Cortex shim on its channel, or a Custom app behind the
// relay; unsandboxed: the shim or the app itself), its spec, and what a
// start takes (a free port, the lease of a fixed one).
import { existsSync } from "node:fs";
import type http from "node:http";
import path from "node:path";
import type { AppResources } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import type { NetnsConnector } from "./netns-connect.js";
import { freePort, type PortLeases } from "./ports.js";
import type { ProjectStorage } from "./project-storage.js";
import { NODE_SHIM, PYTHON_SHIM, SYSTEM_PYTHON } from "./prepare.js";
import { Replica, type ReplicaSpec } from "./replica.js";
import { programPath, REPLICA_PATH } from "./replica-env.js";
import type { ReplicaFactory } from "./replica-set.js";
import { APP_MOUNT, CHANNEL_FD, SHIM_MOUNT, type SandboxLimits } from "./sandbox-argv.js";
import type { SandboxOptions } from "./sandbox.js";
import type { AppDeployment, AppLogLine, PreparedDeployment } from "./types.js";

/** The python3 of the replica PATH, if any: it runs the relay of sandboxed Custom apps. */
export const RELAY_PYTHON = REPLICA_PATH.split(":")
  .map((dir) => path.join(dir, "python3"))
  .find((p) => existsSync(p));

/** The port a sandboxed Custom app listens on inside its own network namespace, unless it names one. */
export const SANDBOX_APP_PORT = 8080;

export interface ProcessReplicaOptions {
  workDir: string;
  /** The runner's keep-alive agent, for replicas' health probes. */
  agent: http.Agent;
  logger: Logger;
  ports: PortLeases;
  onLog?: (line: AppLogLine) => void;
  /** SKIFF_REPLICA_LOG_LINES_PER_SECOND: lines each replica may log per second; undefined: no limit. */
  logLinesPerSecond?: number;
  /** Lines a replica of the app logged past that rate and were dropped. */
  onLogsDropped?: (projectId: string, appName: string, lines: number) => void;
  startTimeoutMs: number;
  sandbox: SandboxOptions;
  /** Connections made inside sandboxes, for Custom apps' requests to skip their relay. */
  netns?: NetnsConnector;
  /**
   * The project's secrets as environment variables (ProjectSecretsView.env),
   * read as each replica starts; the app's own [env] wins over a secret of
   * the same name.
   */
  projectEnv?: (projectId: string) => Record<string, string>;
  /** Persistent storage, mounted at /persistent-storage in every sandboxed replica. */
  projectStorage?: ProjectStorage;
}

/**
 * A replica's limits: the machine's, with the memory and CPUs the app's
 * config asks for ([cerebrium.hardware]); never more memory than the
 * machine's limit (SKIFF_REPLICA_MEMORY_MB).
 */
export function appLimits(limits: SandboxLimits, resources: AppResources | undefined): SandboxLimits {
  if (!resources) return limits;
  const out = { ...limits };
  if (resources.memoryMb !== undefined) out.memoryMb = Math.min(resources.memoryMb, limits.memoryMb);
  if (resources.cpu !== undefined) out.cpus = resources.cpu;
  return out;
}

/** Replicas as child processes (replica.ts), sandboxed unless the sandbox is off. */
export class ProcessReplicas implements ReplicaFactory<Replica> {
  private readonly owner: string;

  constructor(
    private readonly deployment: AppDeployment,
    private readonly prepared: PreparedDeployment,
    private readonly o: ProcessReplicaOptions,
    /** The uid (and gid) of the project's sandboxes (uids.ts); undefined when the sandbox is off. */
    private readonly sandboxUid: number | undefined,
  ) {
    if (o.sandbox.enabled && sandboxUid === undefined)
      throw new Error(`a sandboxed pool of ${deployment.projectId}/${deployment.appName} needs its project's uid`);
    this.owner = `${deployment.projectId}/${deployment.appName}`;
  }

  /** The command of a sandboxed replica: the shim on its channel, or the app behind the relay. */
  private sandboxedCommand(): [string, string[]] {
    const { runtime } = this.deployment.config;
    const fd = String(CHANNEL_FD);
    if (runtime.kind === "custom") {
      const port = String(runtime.port ?? SANDBOX_APP_PORT);
      // The Python relay starts in a fraction of Node's time; Node's where there is no python3.
      const relay = RELAY_PYTHON
        ? `${RELAY_PYTHON} -I -S ${SHIM_MOUNT}/relay.py ${fd} ${port}`
        : `${process.execPath} ${SHIM_MOUNT}/relay.mjs ${fd} ${port}`;
      const script = `${relay} &\nunset PWD\nexec "$@" ${fd}<&-`;
      return ["/bin/sh", ["-c", script, "sh", ...runtime.command]];
    }
    if (runtime.language === "python") {
      const venv =
        this.prepared.python && path.posix.join(APP_MOUNT, path.relative(this.deployment.dir, this.prepared.python));
      return [venv ?? SYSTEM_PYTHON, ["-u", `${SHIM_MOUNT}/cortex.py`, "--fd", fd, runtime.entry]];
    }
    return [process.execPath, [`${SHIM_MOUNT}/cortex.mjs`, "--fd", fd, runtime.entry]];
  }

  create(replicaId: string, onExit: (r: Replica, code: number | null, signal: NodeJS.Signals | null) => void): Replica {
    const d = this.deployment;
    const { runtime } = d.config;
    const sandboxed = this.o.sandbox.enabled;
    let command: string;
    let args: string[];
    if (sandboxed) [command, args] = this.sandboxedCommand();
    else if (runtime.kind === "custom") [command, args] = [runtime.command[0], runtime.command.slice(1)];
    else if (runtime.language === "python")
      [command, args] = [this.prepared.python ?? SYSTEM_PYTHON, ["-u", PYTHON_SHIM, runtime.entry]];
    else [command, args] = [process.execPath, [NODE_SHIM, runtime.entry]];
    const fixedPort = runtime.kind === "custom" && runtime.port !== undefined ? runtime.port : undefined;
    // A Custom app with a venv (cerebrium.toml's pip dependencies) finds its programs first; its [env] may still set PATH.
    const venv = runtime.kind === "custom" ? this.prepared.python : undefined;
    const venvBin = venv && path.dirname(sandboxed ? path.posix.join(APP_MOUNT, path.relative(d.dir, venv)) : venv);
    const env = venvBin ? { PATH: `${venvBin}:${REPLICA_PATH}`, ...d.config.env } : d.config.env;
    const spec: ReplicaSpec = {
      projectId: d.projectId,
      appName: d.appName,
      version: d.version,
      replicaId,
      source: d.dir,
      workDir: path.join(this.o.workDir, d.projectId, d.appName, replicaId),
      command,
      args,
      env,
      port: sandboxed ? (fixedPort ?? SANDBOX_APP_PORT) : (fixedPort ?? 0),
      healthcheck: runtime.kind === "custom" ? runtime.healthcheck : "/health",
      startTimeoutMs: this.o.startTimeoutMs,
      connections: d.config.scaling.replicaConcurrency,
      sandbox: sandboxed
        ? {
            host: this.o.sandbox.host,
            uid: this.sandboxUid!,
            limits: appLimits(this.o.sandbox.limits, d.config.resources),
            network: this.o.sandbox.network,
          }
        : undefined,
    };
    if (sandboxed && runtime.kind === "custom")
      Object.assign(spec, { commandCheck: runtime.command[0], commandPath: programPath(venv), relayed: true });
    return new Replica(spec, {
      agent: this.o.agent,
      netns: this.o.netns,
      logger: this.o.logger,
      onLog: this.o.onLog,
      logLinesPerSecond: this.o.logLinesPerSecond,
      onLogsDropped: this.o.onLogsDropped,
      onExit,
    });
  }

  async prepare(r: Replica): Promise<void> {
    if (r.spec.port === 0) r.spec.port = await freePort();
  }

  async start(r: Replica): Promise<void> {
    const { runtime, env } = this.deployment.config;
    const { projectId } = this.deployment;
    // Read at each start: a replica started after a secret changed has its new value.
    if (this.o.projectEnv) r.spec.env = { ...this.o.projectEnv(projectId), ...env };
    if (r.spec.sandbox && this.o.projectStorage)
      r.spec.sandbox.storage = (await this.o.projectStorage.source(projectId, r.spec.sandbox.uid)).path;
    if (runtime.kind === "custom" && runtime.port !== undefined)
      r.releasePort = await this.o.ports.acquire(runtime.port, this.owner, { sandboxed: this.o.sandbox.enabled });
    await r.start();
  }
}
