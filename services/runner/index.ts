// The runner role: app replicas as child processes, deployments prepared
// per machine, the runner's end of the runner client and the async run queue.
export { decodeLogLine } from "./app-logs.js";
export type { LogLineRecord } from "./app-logs.js";
export { DeploymentCache, prepareBundle } from "./deployment-cache.js";
export type { ReplicaRecord } from "./replica-publisher.js";
export { deploymentsDir, startRunnerRole } from "./role.js";
export { configureSandbox } from "./sandbox.js";
export type { Runner } from "./runner.js";
export type { PreparedDeployment } from "./types.js";
