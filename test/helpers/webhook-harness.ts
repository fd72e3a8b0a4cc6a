// What the webhook tests share: a real nats-server, provisioned as skiff
// provisions it, a client, webhook roles whose log lines are kept for
// inspection, and cleanup of all of it.
import type { NatsConnection } from "nats";
import { pino } from "pino";
import { vi } from "vitest";
import { listDeliveries } from "../../services/webhooks/deliveries.js";
import { startWebhookRole, type WebhookRole, type WebhookRoleOptions } from "../../services/webhook/role.js";
import type { WebhookDelivery } from "../../gen/skiff/management/v2/management_pb.js";
import { startProvisionedNats, type TestNats } from "./nats-server.js";

export interface WebhookHarness {
  nats: TestNats;
  nc: NatsConnection;
  /** Every log line of every role started here, as JSON text. */
  logs: string[];
  startRole(opts?: Partial<Omit<WebhookRoleOptions, "nc" | "logger">>): Promise<WebhookRole>;
  /** Polls listDeliveries until `done` holds for the run's deliveries. */
  waitForDeliveries(
    runId: string,
    done: (d: WebhookDelivery[]) => boolean,
    timeoutMs?: number,
  ): Promise<WebhookDelivery[]>;
  close(): Promise<void>;
}

export const LOCAL = ["127.0.0.0/8"];

export async function startWebhookHarness(): Promise<WebhookHarness> {
  const server = await startProvisionedNats();
  const { nats, nc } = server;
  const logs: string[] = [];
  const roles: WebhookRole[] = [];
  return {
    nats,
    nc,
    logs,
    async startRole(opts = {}) {
      const logger = pino({ level: "trace" }, { write: (line: string) => void logs.push(line) });
      const role = await startWebhookRole({ nc, logger, allowedCidrs: LOCAL, ...opts });
      roles.push(role);
      return role;
    },
    waitForDeliveries(runId, done, timeoutMs = 60_000) {
      return vi.waitFor(
        async () => {
          const d = await listDeliveries(nc, runId);
          if (done(d)) return d;
          // On timeout, the last of these is the error.
          throw new Error(
            `deliveries of ${runId} not as expected after ${timeoutMs} ms: ${JSON.stringify(d.map((x) => ({ id: x.deliveryId, state: x.state, attempts: x.attempts.length })))}`,
          );
        },
        { timeout: timeoutMs },
      );
    },
    async close() {
      for (const r of roles) await r.close();
      await server.stop();
    },
  };
}

/** Every delivery over (delivered or failed). */
export const settled = (d: WebhookDelivery[]) => d.length > 0 && d.every((x) => x.state !== "pending");
