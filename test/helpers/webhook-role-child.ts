// A webhook process for tests that kill one: started with
// `node --import tsx test/helpers/webhook-role-child.ts`, configured by
// environment, logging JSON lines to stdout, and printing "ready" once it
// consumes. A SIGKILL stops it as a crash would.
import { connect } from "nats";
import { pino } from "pino";
import { startWebhookRole } from "../../services/webhook/role.js";

const nc = await connect({ servers: process.env.NATS_URL });
const role = await startWebhookRole({
  nc,
  logger: pino({ level: "debug" }),
  allowedCidrs: ["127.0.0.0/8"],
  timeoutMs: Number(process.env.WEBHOOK_TIMEOUT_MS),
  // Unset: the production default.
  ackWaitMs: process.env.WEBHOOK_ACK_WAIT_MS ? Number(process.env.WEBHOOK_ACK_WAIT_MS) : undefined,
});
process.stdout.write("ready\n");
process.on("SIGTERM", () => void role.close().then(() => nc.close()));
