// Prints skiff's public run events as they happen: one line per state change
// of every run (queued, running, success, failure, cancelled).
//
//   SKIFF_NATS_URL=nats://127.0.0.1:4222 npx tsx examples/event-consumer/consume.ts
//     --subject skiff.events.runs.p-dev.>   only project p-dev (default: every run)
//     --from-start                          replay what the stream still holds (default: new events only)
//     --durable my-service                  a named consumer that resumes where it stopped
//     --max 10                              stop after 10 events
//
// Without --durable the consumer is ephemeral: the server removes it a minute
// after this program stops. Events are acked once printed; with a durable
// consumer, an event not acked (the program died first) comes again.
import { parseArgs } from "node:util";
import { fromBinary } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { AckPolicy, connect, DeliverPolicy, nanos } from "nats";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";

const { values: args } = parseArgs({
  options: {
    subject: { type: "string", default: "skiff.events.runs.>" },
    "from-start": { type: "boolean", default: false },
    durable: { type: "string" },
    max: { type: "string" },
  },
});
const max = args.max === undefined ? Infinity : Number(args.max);

const nc = await connect({ servers: process.env.SKIFF_NATS_URL ?? "nats://127.0.0.1:4222" });
const jsm = await nc.jetstreamManager();
const info = await jsm.consumers.add("SKIFF_EVENTS", {
  durable_name: args.durable,
  filter_subject: args.subject,
  deliver_policy: args["from-start"] ? DeliverPolicy.All : DeliverPolicy.New,
  ack_policy: AckPolicy.Explicit,
  ...(args.durable === undefined ? { inactive_threshold: nanos(60_000) } : {}),
});
const consumer = await nc.jetstream().consumers.get("SKIFF_EVENTS", info.name);
const messages = await consumer.consume();
let seen = 0;
for await (const m of messages) {
  const e = fromBinary(RunEventSchema, m.data);
  const when = e.time ? timestampDate(e.time).toISOString() : "-";
  const detail = e.error ? ` ${e.error.type}: ${e.error.message}` : e.runTimeMs ? ` ${e.runTimeMs} ms` : "";
  console.log(
    `${when} ${e.runId} ${e.projectId}/${e.appName}/${e.path} ${e.status}${e.async ? " async" : ""}${detail}`,
  );
  m.ack();
  if (++seen >= max) break;
}
await nc.drain();
