// Apps: skiff.toml and cerebrium.toml, bundles (packing and safe unpacking), the registry of
// deployed apps every process follows, what preparing a deployment learns
// and the check a deployment passes, and what runners report of an app: its
// replicas (KV skiff-replicas) and log lines (SKIFF_LOGS).
export { APP_NAME_PATTERN, AppConfigError, loadAppConfig, parseAppConfig } from "./app-config.js";
export type { AppConfig, AppResources } from "./app-config.js";
export { parseConfigFile, readAppConfig, removeUnselected } from "./config-file.js";
export { PIP_SPECIFIER } from "./cerebrium-config.js";
export { APP_CONFIG_FILE, BundleError, CONFIG_FILES, inspectBundle, packApp, sha256, unpackBundle } from "./bundle.js";
export type { ConfigFileName } from "./bundle.js";
export { AppRegistry, appKey, decodeAppRecord } from "./registry.js";
export type { AppRecord, DeploymentRecord } from "./registry.js";
export type { PrepareBundle, PreparedDeployment } from "./prepared.js";
export { appReplicaKeys, decodeReplicaRecord, encodeReplicaRecord, replicaKey } from "./replicas.js";
export type { ReplicaRecord } from "./replicas.js";
export { decodeLogLine, encodeLogLine } from "./log-lines.js";
export type { LogLineRecord } from "./log-lines.js";
