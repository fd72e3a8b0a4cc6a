// The invocation role of a process: the views and handles its handlers use.
// It follows the process's app registry and uses its run helpers and, when
// the runner role runs in this process too, calls that runner directly for
// the apps it hosts (runner-client/).
import type { ConnectRouter } from "@connectrpc/connect";
import type { NatsConnection } from "nats";
import type { AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { buckets, type StoreWatch } from "../nats/index.js";
import { NatsRunnerClient, runnerClient, type HostedRunner } from "../runner-client/index.js";
import { finishSync, publishRunEventUnacked, type RunContext } from "../runs/index.js";
import type { Cors, UpgradeHandler } from "../server/index.js";
import { InvocationService, type RunRequest } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { createSecretBox, secretsBucket, AddressGuard } from "../webhooks/index.js";
import type { InvocationDeps } from "./deps.js";
import { QueueDepths } from "./queue-depth.js";
import { routes } from "./routes.js";
import { webSockets, type WebSocketOptions } from "./websocket.js";

export interface InvocationRoleOptions {
  nc: NatsConnection;
  logger: Logger;
  /** The process's app registry. */
  registry: AppRegistry;
  /** The process's run helpers. */
  runs: RunContext;
  /** This process's runner, when the runner role runs here. */
  runner?: HostedRunner;
  /** SKIFF_MAX_QUEUED_RUNS. */
  maxQueuedRuns: number;
  /** The stores' bytes and budgets: a full SKIFF_RUNS refuses async runs with 503. */
  storeWatch?: StoreWatch;
  /** SKIFF_WEBHOOK_ALLOWED_CIDRS. */
  webhookAllowedCidrs: readonly string[];
  /** SKIFF_SECRETS_KEY. */
  secretsKey?: string;
  /** WebSocket calls: how their tokens are checked, their limits, their gauge. */
  websocket: WebSocketOptions;
}

export interface InvocationRole {
  routes(router: ConnectRouter): void;
  /** WebSocket calls (websocket.ts). */
  upgrade: UpgradeHandler;
  /** The CORS allow-list of the app a REST call of Run names (its config's `[cors]`). */
  cors: Cors;
  /** Waits until the WebSocket connections the port closed are recorded. */
  close(): Promise<void>;
}

export async function startInvocationRole(opts: InvocationRoleOptions): Promise<InvocationRole> {
  const { nc, logger, runs } = opts;
  const js = nc.jetstream();
  const finishDeps = { nc, runs: runs.store, results: runs.results, logger };
  const deps: InvocationDeps = {
    nc,
    js,
    queueDepths: new QueueDepths(await nc.jetstreamManager()),
    registry: opts.registry,
    runners: runnerClient({ local: opts.runner, remote: new NatsRunnerClient(nc, runs.transfer) }),
    syncRuns: {
      running: (record) => publishRunEventUnacked(nc, record),
      finished: (record, outcome) => finishSync(finishDeps, record, outcome),
    },
    runs: runs.store,
    results: runs.results,
    transfer: runs.transfer,
    control: runs.control,
    secrets: await secretsBucket(nc),
    box: await createSecretBox(nc, { key: opts.secretsKey }),
    idempotency: await js.views.kv(buckets.idempotency.name, { bindOnly: true }),
    guard: new AddressGuard(opts.webhookAllowedCidrs),
    maxQueuedRuns: opts.maxQueuedRuns,
    storeWatch: opts.storeWatch,
    logger,
  };
  const websockets = webSockets(deps, opts.websocket);
  const cors: Cors = {
    methods: new Set([InvocationService.method.run]),
    origins: (pathOnly) => {
      const req = pathOnly as unknown as RunRequest;
      return opts.registry.get(req.projectId, req.appName)?.config.cors?.allowOrigins;
    },
  };
  return {
    routes: (router) => routes(router, deps),
    upgrade: websockets.upgrade,
    cors,
    close: () => websockets.close(),
  };
}
