// In-memory views of KV buckets, fed by watches: what processes consult on
// hot paths (authentication, app lookups) instead of asking
// NATS. Deletions arrive as DEL/PURGE entries and remove the key, which is
// how a deleted service account stops working in every process.
import type { JetStreamManager, KV, KvEntry, QueuedIterator } from "nats";
import type { Logger } from "../config/index.js";

/** How long a view waits for the initial values before serving anyway (misses fall back to a KV get). */
const DEFAULT_VIEW_INIT_TIMEOUT_MS = 5_000;
/** Pause before a watch that ended (server restart, stream reset) is established again. */
const DEFAULT_VIEW_RETRY_MS = 500;

interface FollowOptions {
  kv: KV;
  /** Keys to watch, NATS subject syntax (`verify.>`); default all. */
  key?: string;
  /** What the view holds, for log lines. */
  name: string;
  logger: Logger;
  /** Every entry, the current values first, then each change. */
  onEntry: (entry: KvEntry) => void;
  initTimeoutMs?: number;
  /** Ends the watch for good, e.g. when the connection is closed (the process is stopping). */
  shouldStop?: () => boolean;
}

export interface KvFollower {
  /** Resolves once the current values were delivered (or the wait timed out; the watch goes on). */
  ready: Promise<void>;
  stop(): void;
}

/**
 * Watches a bucket until stopped, watching again after a failure: a new watch
 * replays the last value (or delete marker) of every key, so it catches up
 * on what it missed.
 */
export function followKv(opts: FollowOptions): KvFollower {
  let watcher: QueuedIterator<KvEntry> | undefined;
  let stopped = false;
  const done = () => stopped || (opts.shouldStop?.() ?? false);
  const ready = new Promise<void>((resolve) => {
    const timer = setTimeout(() => {
      opts.logger.warn({ view: opts.name }, "KV view not loaded in time; going on while the watch fills it");
      resolve();
    }, opts.initTimeoutMs ?? DEFAULT_VIEW_INIT_TIMEOUT_MS);
    timer.unref();
    const initialized = () => {
      clearTimeout(timer);
      resolve();
    };
    void (async () => {
      while (!done()) {
        try {
          watcher = await opts.kv.watch({ key: opts.key, initializedFn: initialized });
          if (done()) watcher.stop();
          for await (const entry of watcher) opts.onEntry(entry);
        } catch (err) {
          if (!done()) opts.logger.warn({ err, view: opts.name }, "KV watch failed; watching again");
        }
        if (!done()) await new Promise((r) => setTimeout(r, DEFAULT_VIEW_RETRY_MS));
      }
    })();
  });
  return {
    ready,
    stop() {
      stopped = true;
      watcher?.stop();
    },
  };
}

interface KvViewOptions<T> {
  kv: KV;
  /** Keys to watch, NATS subject syntax (`verify.>`); default all. */
  key?: string;
  /** Turns a stored value into T; undefined drops a value that cannot be read. */
  decode: (entry: KvEntry) => T | undefined;
  logger: Logger;
  /** What the view holds, for log lines. */
  name: string;
}

/** A map of a bucket's (or a key range's) decoded values. */
export class KvView<T> {
  private readonly entries = new Map<string, T>();
  /** Keys this process deleted ahead of the watch: PUTs at or below the revision are old news. */
  private readonly deletedUpTo = new Map<string, number>();
  private follower: KvFollower | undefined;

  constructor(private readonly opts: KvViewOptions<T>) {}

  get size(): number {
    return this.entries.size;
  }

  get(key: string): T | undefined {
    return this.entries.get(key);
  }

  values(): IterableIterator<T> {
    return this.entries.values();
  }

  /** Sets a value ahead of the watch (a write made by this process). */
  set(key: string, value: T): void {
    this.entries.set(key, value);
  }

  /**
   * Removes a key ahead of the watch (a delete made by this process of the
   * value at `revision`): the watch's older PUTs of it, still on their way, do
   * not bring it back.
   */
  delete(key: string, revision: number): void {
    this.entries.delete(key);
    this.deletedUpTo.set(key, Math.max(revision, this.deletedUpTo.get(key) ?? 0));
  }

  /** Starts watching; resolves once the current values are loaded (or the wait timed out). */
  start(timeoutMs = DEFAULT_VIEW_INIT_TIMEOUT_MS): Promise<void> {
    this.follower = followKv({ ...this.opts, initTimeoutMs: timeoutMs, onEntry: (e) => this.apply(e) });
    return this.follower.ready;
  }

  close(): void {
    this.follower?.stop();
  }

  private apply(entry: KvEntry): void {
    const floor = this.deletedUpTo.get(entry.key);
    if (floor !== undefined) {
      if (entry.operation === "PUT" && entry.revision <= floor) return;
      this.deletedUpTo.delete(entry.key);
    }
    if (entry.operation !== "PUT") {
      this.entries.delete(entry.key);
      return;
    }
    const value = this.opts.decode(entry);
    if (value === undefined) {
      this.opts.logger.warn({ view: this.opts.name, key: entry.key }, "unreadable KV value ignored");
      this.entries.delete(entry.key);
    } else {
      this.entries.set(entry.key, value);
    }
  }
}

const utf8 = new TextDecoder();

/** Parses a JSON KV value (of a watch's entry or of kvGetLatest's), or undefined when it is not JSON. */
export function jsonOf(entry: Pick<KvEntry, "value">): unknown {
  try {
    return JSON.parse(utf8.decode(entry.value)) as unknown;
  } catch {
    return undefined;
  }
}

/**
 * The keys of `bucket` that match `filter` (subject syntax), from the
 * stream's own index of subjects, in one request. A key whose last entry is
 * a delete marker is listed too: the caller's get() tells. Every listing of
 * keys goes through here: kv.keys() counts down the pending messages of a
 * consumer instead, and on a three-node nats-server 2.9 cluster it was seen
 * to end after the first of two live keys of skiff-replicas, again and again.
 */
export async function kvKeys(jsm: JetStreamManager, bucket: string, filter: string): Promise<string[]> {
  const prefix = `$KV.${bucket}.`;
  const info = await jsm.streams.info(`KV_${bucket}`, { subjects_filter: `${prefix}${filter}` });
  return Object.keys(info.state.subjects ?? {}).map((subject) => subject.slice(prefix.length));
}
