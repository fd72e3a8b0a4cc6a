// The invocation role of a process: the views and handles its handlers use.
// It follows the app registry (the process's own when another role already
// does) and, when the runner role runs in this process too, calls that
// runner directly for sync runs.
import type { ConnectRouter } from "@connectrpc/connect";
import type { NatsConnection } from "nats";
import type { Runner } from "../runner/index.js";
import { AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { buckets } from "../nats/index.js";
import { RunControl, RunResults, RunStore, BodyTransfer } from "../runs/index.js";
import { createSecretBox, secretsBucket, AddressGuard } from "../webhook/index.js";
import type { InvocationDeps } from "./deps.js";
import { routes } from "./routes.js";

export interface InvocationRoleOptions {
  nc: NatsConnection;
  logger: Logger;
  /** The process's registry, when another role follows one; else the role starts its own. */
  registry?: AppRegistry;
  runner?: Runner;
  /** SKIFF_RESULT_TTL, seconds. */
  resultTtlSeconds: number;
  /** SKIFF_MAX_QUEUED_RUNS. */
  maxQueuedRuns: number;
  /** SKIFF_WEBHOOK_ALLOWED_CIDRS. */
  webhookAllowedCidrs: readonly string[];
  /** SKIFF_SECRETS_KEY. */
  secretsKey?: string;
}

export interface InvocationRole {
  routes(router: ConnectRouter): void;
  close(): void;
}

export async function startInvocationRole(opts: InvocationRoleOptions): Promise<InvocationRole> {
  const { nc, logger } = opts;
  const js = nc.jetstream();
  const registry = opts.registry ?? (await AppRegistry.start(nc, logger));
  const results = new RunResults(js, nc, opts.resultTtlSeconds);
  const control = new RunControl();
  control.listen(nc);
  const deps: InvocationDeps = {
    nc,
    js,
    jsm: await nc.jetstreamManager(),
    registry,
    runner: opts.runner,
    runs: await RunStore.open(nc),
    results,
    transfer: new BodyTransfer(nc, () => results.objects()),
    control,
    secrets: await secretsBucket(nc),
    box: await createSecretBox(nc, { key: opts.secretsKey }),
    idempotency: await js.views.kv(buckets.idempotency.name, { bindOnly: true }),
    guard: new AddressGuard(opts.webhookAllowedCidrs),
    maxQueuedRuns: opts.maxQueuedRuns,
    logger,
  };
  return {
    routes: (router) => routes(router, deps),
    close() {
      control.close();
      if (opts.registry === undefined) registry.close();
    },
  };
}
