// App log lines on NATS: each line a replica writes becomes one JSON message
// on `skiff.logs.{project}.{app}`, kept by stream SKIFF_LOGS (24 h, a cap
// per app); runners publish them (runner/app-logs.ts) and GetAppLogs reads
// them in any management process.

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

export function encodeLogLine(record: LogLineRecord): Uint8Array {
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
