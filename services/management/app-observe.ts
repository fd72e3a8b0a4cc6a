// What the runners report about an app: its live replicas (KV
// `skiff-replicas`, written by every runner process) and its log lines
// (stream SKIFF_LOGS, subject `skiff.logs.{project}.{app}`).
import {
  consumerOpts,
  type JetStreamClient,
  type JetStreamManager,
  type JetStreamSubscription,
  type KV,
  type NatsConnection,
} from "nats";
import {
  appReplicaKeys,
  decodeLogLine,
  decodeReplicaRecord,
  type LogLineRecord,
  type ReplicaRecord,
} from "../apps/index.js";
import { buckets, kvKeys, streams, subjects } from "../nats/index.js";

export const DEFAULT_LOG_LIMIT = 200;
export const MAX_LOG_LIMIT = 5000;

interface SequencedLine {
  seq: number;
  line: LogLineRecord;
}

export class AppObserver {
  private constructor(
    private readonly replicasKv: KV,
    private readonly js: JetStreamClient,
    private readonly jsm: JetStreamManager,
  ) {}

  static async start(nc: NatsConnection): Promise<AppObserver> {
    const js = nc.jetstream();
    return new AppObserver(
      await js.views.kv(buckets.replicas.name, { bindOnly: true }),
      js,
      await nc.jetstreamManager(),
    );
  }

  /** Live replicas of the app on every runner, oldest first. */
  async replicas(projectId: string, appName: string): Promise<ReplicaRecord[]> {
    const keys = await kvKeys(this.jsm, buckets.replicas.name, appReplicaKeys(projectId, appName));
    const entries = await Promise.all(keys.map((k) => this.replicasKv.get(k)));
    const records = entries.map((e) => (e && e.operation === "PUT" ? decodeReplicaRecord(e.value) : undefined));
    return records
      .filter((r): r is ReplicaRecord => r !== undefined)
      .sort((a, b) => a.started_at.localeCompare(b.started_at));
  }

  /** Sequence of the newest message of SKIFF_LOGS, of any app. */
  async streamLastSeq(): Promise<number> {
    return (await this.jsm.streams.info(streams.logs.name)).state.last_seq;
  }

  /** Sequence of the app's newest line, or 0 when it has none. */
  private async lastSeq(subject: string): Promise<number> {
    try {
      return (await this.jsm.streams.getMessage(streams.logs.name, { last_by_subj: subject })).seq;
    } catch {
      return 0; // no message on the subject (the server answers "no message found")
    }
  }

  /** The newest `limit` lines of the app (of one run when `runId` is set), oldest first, and the sequence they end at. */
  async lines(
    projectId: string,
    appName: string,
    /** `sinceMs`: only lines stored from then on (a project's own, when one of its id was deleted before). */
    opts: { limit: number; runId?: string; sinceMs?: number },
  ): Promise<{ lines: SequencedLine[]; lastSeq: number }> {
    const subject = subjects.appLogs(projectId, appName);
    const last = await this.lastSeq(subject);
    const out: SequencedLine[] = [];
    if (last === 0 || opts.limit === 0) return { lines: out, lastSeq: last };
    // Lines are read from the start of the subject: SKIFF_LOGS keeps a bounded number per app.
    const messages = await this.ordered(subject, 1);
    for await (const m of messages) {
      const line = decodeLogLine(m.data);
      const stored = m.info.timestampNanos / 1e6;
      if (
        line &&
        (!opts.runId || line.run_id === opts.runId) &&
        (opts.sinceMs === undefined || stored >= opts.sinceMs)
      ) {
        out.push({ seq: m.seq, line });
        if (out.length > opts.limit) out.shift();
      }
      if (m.seq >= last) break;
    }
    messages.unsubscribe();
    return { lines: out, lastSeq: last };
  }

  /** Lines of the app written after sequence `after`, as they come, until `signal` aborts. */
  async *follow(projectId: string, appName: string, after: number, signal: AbortSignal): AsyncGenerator<LogLineRecord> {
    const subject = subjects.appLogs(projectId, appName);
    const messages = await this.ordered(subject, after + 1);
    const stop = () => messages.unsubscribe();
    signal.addEventListener("abort", stop, { once: true });
    try {
      for await (const m of messages) {
        if (signal.aborted) break;
        const line = decodeLogLine(m.data);
        if (line) yield line;
      }
    } finally {
      signal.removeEventListener("abort", stop);
      messages.unsubscribe();
    }
  }

  /**
   * An ordered push consumer of one subject from sequence `start` (an
   * ephemeral consumer the server drops once unsubscribed); it works with
   * every JetStream server version skiff supports.
   */
  private ordered(subject: string, start: number): Promise<JetStreamSubscription> {
    const opts = consumerOpts().orderedConsumer().startSequence(start);
    return this.js.subscribe(subject, opts);
  }
}
