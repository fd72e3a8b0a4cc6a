// Publishes this process's replicas to KV `skiff-replicas` so that GetApp,
// answered by any management process, lists the live replicas of every
// runner. Each replica is one key (apps/replicas.ts), written on every change
// and again every refresh period: the bucket's TTL removes the replicas of a
// runner that died without saying goodbye.
import { hostname } from "node:os";
import type { KV, NatsConnection } from "nats";
import { encodeReplicaRecord, replicaKey, type ReplicaRecord } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { buckets } from "../nats/index.js";
import type { ReplicaChange, ReplicaInfo } from "./types.js";

/** A third of the bucket's TTL: two refreshes can be lost before a live replica disappears. */
export const DEFAULT_REPLICA_REFRESH_MS = Math.floor(buckets.replicas.ttlMs / 3);

export class ReplicaPublisher {
  private readonly host = hostname();
  private readonly runner = `${this.host}:${process.pid}`;
  /** Keys this process wrote and has not deleted yet. */
  private readonly mine = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private writes: Promise<unknown> = Promise.resolve();

  private constructor(
    private readonly kv: KV,
    private readonly logger: Logger,
  ) {}

  static async start(nc: NatsConnection, logger: Logger): Promise<ReplicaPublisher> {
    return new ReplicaPublisher(await nc.jetstream().views.kv(buckets.replicas.name, { bindOnly: true }), logger);
  }

  /** Re-publishes `current()` every `periodMs`, and removes keys of replicas no longer in it. */
  refreshEvery(periodMs: number, current: () => ReplicaChange[]): void {
    this.timer = setInterval(() => {
      const live = new Set<string>();
      for (const c of current()) {
        live.add(replicaKey(c.projectId, c.appName, c.replica.replicaId));
        this.changed(c);
      }
      for (const key of this.mine) if (!live.has(key)) this.remove(key);
    }, periodMs);
    this.timer.unref();
  }

  changed(c: ReplicaChange): void {
    const key = replicaKey(c.projectId, c.appName, c.replica.replicaId);
    if (c.replica.state === "stopped") return this.remove(key);
    this.mine.add(key);
    this.write(() => this.kv.put(key, encodeReplicaRecord(this.record(c.replica))));
  }

  /** Removes every key this process wrote; the replicas are gone with it. */
  async close(): Promise<void> {
    clearInterval(this.timer);
    for (const key of this.mine) this.remove(key);
    await this.writes;
  }

  private remove(key: string): void {
    if (!this.mine.delete(key)) return;
    this.write(() => this.kv.delete(key));
  }

  /** One write at a time, in order, so a put never overtakes the delete that followed it. */
  private write(op: () => Promise<unknown>): void {
    this.writes = this.writes
      .then(op)
      .catch((err: unknown) => this.logger.warn({ err }, "cannot publish a replica to KV"));
  }

  private record(r: ReplicaInfo): ReplicaRecord {
    return {
      replica_id: r.replicaId,
      state: r.state,
      host: this.host,
      runner: this.runner,
      in_flight: r.inFlight,
      deployment_version: r.deploymentVersion,
      started_at: r.startedAt.toISOString(),
      seen_at: new Date().toISOString(),
    };
  }
}
