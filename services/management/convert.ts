// Stored records to the messages of management.proto.
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { AppConfig, AppRecord, DeploymentRecord, LogLineRecord, ReplicaRecord } from "../apps/index.js";
import type { ServiceAccountRecord } from "../auth/index.js";
import type { ProjectRecord } from "./project-store.js";

export function projectMessage(r: ProjectRecord) {
  return { projectId: r.project_id, name: r.name, createdAt: timestampFromDate(new Date(r.created_at)) };
}

export function serviceAccountMessage(r: ServiceAccountRecord) {
  return {
    serviceAccountId: r.service_account_id,
    name: r.name,
    createdAt: timestampFromDate(new Date(r.created_at)),
    expiresAt: timestampFromDate(new Date(r.expires_at)),
  };
}

export function deploymentMessage(d: DeploymentRecord) {
  return {
    version: d.version,
    createdAt: timestampFromDate(new Date(d.created_at)),
    bundleBytes: BigInt(d.bundle_bytes),
    digest: d.digest,
    createdBy: d.created_by,
  };
}

function runtimeMessage(config: AppConfig) {
  const rt = config.runtime;
  const corsAllowOrigins = config.cors?.allowOrigins ?? [];
  const limits = { cpu: config.resources?.cpu ?? 0, memoryMb: config.resources?.memoryMb ?? 0 };
  return rt.kind === "cortex"
    ? { kind: rt.kind, language: rt.language, entry: rt.entry, corsAllowOrigins, ...limits }
    : {
        kind: rt.kind,
        command: rt.command,
        healthcheck: rt.healthcheck,
        readycheck: rt.readycheck ?? "",
        port: rt.port ?? 0,
        corsAllowOrigins,
        ...limits,
      };
}

function replicaMessage(r: ReplicaRecord) {
  return {
    replicaId: r.replica_id,
    state: r.state,
    host: r.host,
    inFlight: r.in_flight,
    deploymentVersion: r.deployment_version,
    startedAt: timestampFromDate(new Date(r.started_at)),
  };
}

export function appMessage(r: AppRecord, replicas: ReplicaRecord[]) {
  const s = r.config.scaling;
  return {
    projectId: r.project_id,
    appName: r.app_name,
    runtime: runtimeMessage(r.config),
    scaling: {
      minReplicas: s.minReplicas,
      maxReplicas: s.maxReplicas,
      replicaConcurrency: s.replicaConcurrency,
      cooldown: s.cooldown,
      responseGracePeriod: s.responseGracePeriod,
    },
    deployment: deploymentMessage(r.deployment),
    replicas: replicas.map(replicaMessage),
    createdAt: timestampFromDate(new Date(r.created_at)),
    updatedAt: timestampFromDate(new Date(r.updated_at)),
    envNames: Object.keys(r.config.env).sort(),
    configFile: r.config.source ?? "skiff.toml",
  };
}

export function logLineMessage(l: LogLineRecord) {
  return {
    time: timestampFromDate(new Date(l.time)),
    replicaId: l.replica_id,
    stream: l.stream,
    runId: l.run_id,
    text: l.text,
  };
}
