// Publishes each line a replica writes as one message of the apps domain's
// form (apps/log-lines.ts) on `skiff.logs.{project}.{app}`, without waiting
// for an acknowledgement: logging must never slow a replica down, and a line
// lost while NATS is away is a lesser harm than a stalled app.
import type { NatsConnection } from "nats";
import { encodeLogLine } from "../apps/index.js";
import { subjects } from "../nats/index.js";
import type { AppLogLine } from "./types.js";

export function logPublisher(nc: NatsConnection): (line: AppLogLine) => void {
  return (line) => {
    if (nc.isClosed()) return;
    const record = {
      time: line.time.toISOString(),
      replica_id: line.replicaId,
      stream: line.stream,
      run_id: line.runId ?? "",
      text: line.text,
    };
    nc.publish(subjects.appLogs(line.projectId, line.appName), encodeLogLine(record));
  };
}
