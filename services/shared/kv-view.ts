// An in-memory view of (part of) a KV bucket, fed by a watch: what every
// process consults on the hot path of authentication instead of asking NATS.
// Deletions arrive as DEL/PURGE entries and remove the key, which is how a
// deleted service account stops working in every process.
import type { KV, KvEntry, QueuedIterator } from "nats";
import type { Logger } from "./logger.js";

/** How long start() waits for the initial values before serving anyway (misses fall back to a KV get). */
export const DEFAULT_VIEW_INIT_TIMEOUT_MS = 5_000;
/** Pause before a watch that ended (server restart, stream reset) is established again. */
export const DEFAULT_VIEW_RETRY_MS = 500;

export interface KvViewOptions<T> {
  kv: KV;
  /** Keys to watch, NATS subject syntax (`verify.>`); default all. */
  key?: string;
  /** Turns a stored value into T; undefined drops a value that cannot be read. */
  decode: (entry: KvEntry) => T | undefined;
  logger: Logger;
  /** What the view holds, for log lines. */
  name: string;
}

export class KvView<T> {
  private readonly entries = new Map<string, T>();
  private watcher: QueuedIterator<KvEntry> | undefined;
  private closed = false;

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

  /** Starts watching; resolves once the current values are loaded (or the wait timed out). */
  start(timeoutMs = DEFAULT_VIEW_INIT_TIMEOUT_MS): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.opts.logger.warn({ view: this.opts.name }, "KV view not loaded in time; serving with KV lookups until it is");
        resolve();
      }, timeoutMs);
      timer.unref();
      void this.run(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  close(): void {
    this.closed = true;
    this.watcher?.stop();
  }

  private async run(initialized: () => void): Promise<void> {
    while (!this.closed) {
      try {
        this.watcher = await this.opts.kv.watch({ key: this.opts.key, initializedFn: initialized });
        if (this.closed) this.watcher.stop();
        for await (const entry of this.watcher) this.apply(entry);
      } catch (err) {
        if (!this.closed) this.opts.logger.warn({ err, view: this.opts.name }, "KV watch failed; watching again");
      }
      if (!this.closed) await new Promise((r) => setTimeout(r, DEFAULT_VIEW_RETRY_MS));
    }
  }

  private apply(entry: KvEntry): void {
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

/** Parses a JSON KV value, or undefined when it is not JSON. */
export function jsonOf(entry: KvEntry): unknown {
  try {
    return entry.json<unknown>();
  } catch {
    return undefined;
  }
}
