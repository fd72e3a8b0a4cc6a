// The runner role: app replicas as child processes, deployments prepared
// per machine, sync dispatch over NATS and the async run queue.
export { DeploymentCache, prepareBundle } from "./deployment-cache.js";
export { deploymentsDir, startRunnerRole } from "./role.js";
export { configureSandbox } from "./sandbox-setup.js";
export type { Runner } from "./runner.js";
export type { SandboxOptions } from "./sandbox.js";
export type { UpgradeAnswer, UpgradeRequest } from "./upgrade.js";
export { upgradeRemote } from "./ws-dispatch.js";
