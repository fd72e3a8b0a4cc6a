// App log lines on NATS: each line a replica writes becomes one JSON message
// on `skiff.logs.{project}.{app}`, kept by stream SKIFF_LOGS (24 h, a cap
// per app). Published without waiting for an acknowledgement: logging must
// never slow a replica down, and a line lost while NATS is away is a
// lesser harm than a stalled app.
import type { NatsConnection } from "nats";
import { subjects } from "../nats/index.js";
import type { AppLogLine } from "./types.js";

/** The message body, with the field names of the LogLine message. */
export interface LogLineRecord {
  /** RFC 3339 with milliseconds. */
  time: string;
  replica_id: string;
  stream: "stdout" | "stderr";
  /** "" when the line belongs to no single run. */
  run_id: string;
  text: string;
}

export function encodeLogLine(line: AppLogLine): Uint8Array {
  const record: LogLineRecord = {
    time: line.time.toISOString(),
    replica_id: line.replicaId,
    stream: line.stream,
    run_id: line.runId ?? "",
    text: line.text,
  };
  return new TextEncoder().encode(JSON.stringify(record));
}

export function decodeLogLine(data: Uint8Array): LogLineRecord | undefined {
  try {
    const v = JSON.parse(new TextDecoder().decode(data)) as Partial<LogLineRecord>;
    return typeof v.time === "string" && typeof v.text === "string" && typeof v.replica_id === "string"
      ? (v as LogLineRecord)
      : undefined;
  } catch {
    return undefined;
  }
}

export function logPublisher(nc: NatsConnection): (line: AppLogLine) => void {
  return (line) => {
    if (!nc.isClosed()) nc.publish(subjects.appLogs(line.projectId, line.appName), encodeLogLine(line));
  };
}
