// The runner client: how a gateway reaches the runner of an app (sync runs,
// streamed bodies both ways, WebSocket upgrades), in-process or over NATS
// behind one interface; the runner's end of the NATS protocol; the one byte
// stream and the one codec they use (the async queue's messages too).
export { runnerClient } from "./client.js";
export type { HostedRunner, RunnerClient, UpgradeAnswer, UpgradeRequest } from "./client.js";
export { decodeRequestFrame, encodeRequest, requestMeta } from "./codec.js";
export type { RequestMeta } from "./codec.js";
export { NatsRunnerClient, NatsRunnerServer } from "./nats.js";
