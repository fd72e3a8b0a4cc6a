// Apps: skiff.toml, bundles (packing and safe unpacking), and the registry
// of deployed apps every process follows.
export { APP_CONFIG_FILE, APP_NAME_PATTERN, AppConfigError, loadAppConfig, parseAppConfig } from "./app-config.js";
export type { AppConfig } from "./app-config.js";
export { BundleError, bundleLimits, inspectBundle, packApp, sha256, unpackBundle } from "./bundle.js";
export { AppRegistry, appKey, decodeAppRecord } from "./registry.js";
export type { AppRecord, DeploymentRecord } from "./registry.js";
