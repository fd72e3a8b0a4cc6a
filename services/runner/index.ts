// The runner role: app replicas as child processes, deployments prepared
// per machine, the runner's end of the runner client and the async run queue.
export { logPublisher } from "./app-logs.js";
export { DeploymentCache, prepareBundle } from "./deployment-cache.js";
export { deploymentsDir, startRunnerRole } from "./role.js";
export { configureSandbox } from "./sandbox-setup.js";
export type { Runner } from "./runner.js";
export type { SandboxOptions } from "./sandbox.js";
