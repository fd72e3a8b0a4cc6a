// What the management handlers work with; role.ts builds it once per process.
import type { PrepareBundle } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import type { TokenSubject } from "../auth/index.js";
import type { ProjectSecretStore } from "../secrets/index.js";
import type { AppObserver } from "./app-observe.js";
import type { AppStore } from "./app-store.js";
import type { ProjectStore } from "./project-store.js";
import type { RunApi } from "./runs.js";
import type { ServiceAccountStore } from "./service-account-store.js";

export interface AppDeps {
  store: AppStore;
  observer: AppObserver;
  /** The check a deployment passes before it is recorded. */
  prepare: PrepareBundle;
  /** SKIFF_MAX_PROJECT_UNPACKED_BYTES: what the current deployments of a project's apps may unpack to together. */
  maxProjectUnpackedBytes: number;
  /** SKIFF_MAX_APPS_PER_PROJECT: a project's apps at most. */
  maxAppsPerProject: number;
  /** SKIFF_REPLICA_MEMORY_MB: what a replica gets at most, whatever its app asks for (a deploy warns). */
  replicaMemoryMb?: number;
}

export interface ManagementDeps {
  projects: ProjectStore;
  serviceAccounts: ServiceAccountStore;
  apps: AppDeps;
  /** Project secrets, sealed in KV `skiff-project-secrets`. */
  secrets: ProjectSecretStore;
  /** The run methods (runs.ts). */
  runs: RunApi;
  /** Signs a token with the cluster's current key. */
  issueToken: (subject: TokenSubject) => Promise<string>;
  logger: Logger;
}
