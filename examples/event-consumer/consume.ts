// Prints skiff's public run events as they happen: one line per state change
// of every run (queued, running, success, failure, cancelled).
//
//   npx tsx examples/event-consumer/consume.ts
//     --subject skiff.events.runs.p-dev.>   only project p-dev (default: every run)
//     --from-start                          replay what the stream still holds (default: new events only)
//     --durable my-service                  a named consumer that resumes where it stopped
//     --max 10                              stop after 10 events
//
// The NATS server: SKIFF_NATS_URL, with the nkey seed file SKIFF_NATS_NKEY
// when it admits nkeys only; unset, the nats-server that `npm start` started
// in the data folder (SKIFF_DATA_DIR, else .data): its address from the ports
// file it writes there, and the nkey skiff made for it (`nats/skiff.nk`).
//
// Without --durable the consumer is ephemeral: the server removes it a minute
// after this program stops. Events are acked once printed; with a durable
// consumer, an event not acked (the program died first) comes again.
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { fromBinary } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { AckPolicy, connect, DeliverPolicy, nanos, nkeyAuthenticator, type ConnectionOptions } from "nats";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";

/** Where to connect, and as whom. */
function server(): ConnectionOptions {
  const seed = (file: string) => nkeyAuthenticator(new TextEncoder().encode(readFileSync(file, "utf8").trim()));
  if (process.env.SKIFF_NATS_URL)
    return {
      servers: process.env.SKIFF_NATS_URL,
      ...(process.env.SKIFF_NATS_NKEY ? { authenticator: seed(process.env.SKIFF_NATS_NKEY) } : {}),
    };
  const dir = path.resolve(process.env.SKIFF_DATA_DIR ?? ".data", "nats");
  let ports: string[] = [];
  try {
    ports = readdirSync(dir).filter((name) => /^nats-server_\d+\.ports$/.test(name));
  } catch {
    // no such folder: said below
  }
  // The live server's file: one whose process is a nats-server of this folder (a pid of a server that died may
  // be any process's now, and its port anyone's, who would get this folder's nkey to sign for them).
  const live = ports.find((name) => {
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${/_(\d+)\./.exec(name)![1]}/cmdline`, "utf8").split("\0");
    } catch {
      return false;
    }
    return (
      path.basename(argv[0]) === "nats-server" &&
      argv.slice(1).some((arg) => path.isAbsolute(arg) && path.resolve(arg).startsWith(dir + path.sep))
    );
  });
  if (live === undefined)
    throw new Error(
      `no nats-server started by skiff runs from ${dir}: start skiff (npm start), set SKIFF_DATA_DIR to its data folder, or set SKIFF_NATS_URL (and SKIFF_NATS_NKEY)`,
    );
  const url = (JSON.parse(readFileSync(path.join(dir, live), "utf8")) as { nats: string[] }).nats[0];
  return { servers: url, authenticator: seed(path.join(dir, "skiff.nk")) };
}

const { values: args } = parseArgs({
  options: {
    subject: { type: "string", default: "skiff.events.runs.>" },
    "from-start": { type: "boolean", default: false },
    durable: { type: "string" },
    max: { type: "string" },
  },
});
const max = args.max === undefined ? Infinity : Number(args.max);

const nc = await connect(server());
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
