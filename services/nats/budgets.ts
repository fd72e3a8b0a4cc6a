// Byte budgets of every store skiff keeps: NATS's streams, KV buckets and
// object stores (enforced by JetStream itself: a stream's `max_bytes`, with
// discard-old where the oldest messages may go and discard-new where nothing
// may), and the run history (enforced by its own prune, runs/history/).
//
// A budget is a setting (SKIFF_*_MAX_BYTES), or, unset, a fixed part of
// SKIFF_STORAGE_SHARE of the free space on SKIFF_DATA_DIR's disk, measured
// when the store is first given a budget; JetStream keeps it as the stream's
// `max_bytes`, so later starts keep it and it does not shrink as the disk
// fills. StoreWatch measures every store's bytes against its budget for
// /metrics, warns at 80 % and says which stores are full (/readyz).
import { mkdir, statfs } from "node:fs/promises";
import path from "node:path";
import type { JetStreamManager, NatsConnection } from "nats";
import { MIN_STORE_BUDGET_BYTES, type Config, type Logger } from "../config/index.js";
import { buckets, objectStores, streams } from "./layout.js";

/** The settings of the budgets. */
export type BudgetSettings = Pick<
  Config,
  | "storageShare"
  | "eventsMaxBytes"
  | "webhooksMaxBytes"
  | "runQueueMaxBytes"
  | "logsMaxBytes"
  | "resultsMaxBytes"
  | "bundlesMaxBytes"
  | "kvMaxBytes"
  | "historyMaxBytes"
>;

/** What a store does at its budget. */
export type AtBudget = "drops oldest" | "refuses new";

export interface StoreSpec {
  /** The name /metrics and /readyz use: the stream's, bucket's or object store's, or `run-history`. */
  store: string;
  kind: "stream" | "KV bucket" | "object store" | "run history";
  /** The JetStream stream behind it; undefined for the run history. */
  stream: string | undefined;
  /** The setting of its budget. */
  setting: string;
  /** Its part of SKIFF_STORAGE_SHARE when the setting is unset, percent. */
  weight: number;
  atBudget: AtBudget;
}

export const HISTORY_STORE = "run-history";

/** Percent of SKIFF_STORAGE_SHARE each KV bucket gets by default (eleven buckets: 7.7 in all, 100.7 with the rest). */
const BUCKET_WEIGHT = 0.7;

/**
 * Every store with a budget, and the parts of SKIFF_STORAGE_SHARE they get
 * by default (100.7 in all): the events, which every call writes, most; the
 * queue of accepted runs enough for a long backlog; the small KV buckets
 * little.
 */
export const STORE_SPECS: readonly StoreSpec[] = [
  stream(streams.events.name, "SKIFF_EVENTS_MAX_BYTES", 24, "drops oldest"),
  stream(streams.history.name, "SKIFF_EVENTS_MAX_BYTES", 6, "drops oldest"),
  stream(streams.webhooks.name, "SKIFF_WEBHOOKS_MAX_BYTES", 8, "drops oldest"),
  stream(streams.runs.name, "SKIFF_RUN_QUEUE_MAX_BYTES", 10, "refuses new"),
  stream(streams.lostRuns.name, "SKIFF_RUN_QUEUE_MAX_BYTES", 1, "refuses new"),
  stream(streams.logs.name, "SKIFF_LOGS_MAX_BYTES", 4, "drops oldest"),
  ...Object.values(buckets).map((b): StoreSpec => ({
    store: b.name,
    kind: "KV bucket",
    stream: `KV_${b.name}`,
    setting: "SKIFF_KV_MAX_BYTES",
    weight: BUCKET_WEIGHT,
    atBudget: "refuses new",
  })),
  objectStore(objectStores.results.name, "SKIFF_RESULTS_MAX_BYTES", 15),
  objectStore(objectStores.bundles.name, "SKIFF_BUNDLES_MAX_BYTES", 10),
  {
    store: HISTORY_STORE,
    kind: "run history",
    stream: undefined,
    setting: "SKIFF_HISTORY_MAX_BYTES",
    weight: 15,
    atBudget: "drops oldest",
  },
];

function stream(name: string, setting: string, weight: number, atBudget: AtBudget): StoreSpec {
  return { store: name, kind: "stream", stream: name, setting, weight, atBudget };
}

function objectStore(name: string, setting: string, weight: number): StoreSpec {
  return { store: name, kind: "object store", stream: `OBJ_${name}`, setting, weight, atBudget: "refuses new" };
}

/** The spec of the store behind a JetStream stream. */
export function specOfStream(streamName: string): StoreSpec | undefined {
  return STORE_SPECS.find((s) => s.stream === streamName);
}

/** The budget a setting gives a store, or undefined when it is unset (derived then). */
export function explicitBudget(spec: StoreSpec, settings: BudgetSettings): number | undefined {
  const set: Record<string, number | undefined> = {
    SKIFF_EVENTS_MAX_BYTES: settings.eventsMaxBytes,
    SKIFF_WEBHOOKS_MAX_BYTES: settings.webhooksMaxBytes,
    SKIFF_RUN_QUEUE_MAX_BYTES: settings.runQueueMaxBytes,
    SKIFF_LOGS_MAX_BYTES: settings.logsMaxBytes,
    SKIFF_RESULTS_MAX_BYTES: settings.resultsMaxBytes,
    SKIFF_BUNDLES_MAX_BYTES: settings.bundlesMaxBytes,
    SKIFF_KV_MAX_BYTES: settings.kvMaxBytes,
    SKIFF_HISTORY_MAX_BYTES: settings.historyMaxBytes,
  };
  const bytes = set[spec.setting];
  // SKIFF_LOST_RUNS holds the advisories of runs of SKIFF_RUNS: a tenth of the queue's budget.
  if (bytes !== undefined && spec.stream === streams.lostRuns.name)
    return Math.max(MIN_STORE_BUDGET_BYTES, Math.floor(bytes / 10));
  // SKIFF_HISTORY holds the events' records again, many a message: a quarter of the events' budget.
  if (bytes !== undefined && spec.stream === streams.history.name)
    return Math.max(MIN_STORE_BUDGET_BYTES, Math.floor(bytes / 4));
  return bytes;
}

/** A budget derived from free space: the store's part of SKIFF_STORAGE_SHARE percent of `freeBytes`. */
export function derivedBudget(spec: StoreSpec, storageShare: number, freeBytes: number): number {
  return Math.max(MIN_STORE_BUDGET_BYTES, Math.floor((((freeBytes * storageShare) / 100) * spec.weight) / 100));
}

/** Free bytes (for an unprivileged user) on the disk that holds `dir`, which is made when missing. */
export async function freeDiskBytes(dir: string): Promise<number> {
  await mkdir(path.resolve(dir), { recursive: true });
  const s = await statfs(path.resolve(dir));
  return s.bavail * s.bsize;
}

/** How the budgets of provisioning are given: the settings, and the disk the derived ones are a share of. */
export interface BudgetPlan {
  settings: BudgetSettings;
  /** SKIFF_DATA_DIR: the disk whose free space derived budgets are a share of. */
  dataDir: string;
}

/** One store's bytes and budget, as last measured. */
export interface StoreUsage {
  store: string;
  kind: StoreSpec["kind"];
  atBudget: AtBudget;
  bytes: number;
  /** 0: no budget (a store made before budgets, or by a process given none). */
  budget: number;
}

/** The part of a budget at which a warning is logged. */
export const WARN_AT = 0.8;
/**
 * A store that refuses new writes counts as full this close to its budget:
 * JetStream refuses a message that would take it past, so a store a large
 * message short of its budget already refuses that message.
 */
export const FULL_AT = 0.95;
/** How often StoreWatch measures every store. */
export const WATCH_EVERY_MS = 5_000;

/** A measure of a store outside JetStream (the run history): its bytes now. */
export type StoreMeasure = () => Promise<number>;

/**
 * Measures every store against its budget every WATCH_EVERY_MS: a stream's
 * bytes from its info, the run history's from the measure it registers.
 * Logs a warning when a store passes 80 % of its budget (once, until it
 * falls below 70 %), and an error when a store that refuses new writes is
 * full.
 */
export class StoreWatch {
  private usage = new Map<string, StoreUsage>();
  private readonly warned = new Set<string>();
  private readonly extra = new Map<string, { spec: StoreSpec; budget: number; measure: StoreMeasure }>();
  private timer: ReturnType<typeof setInterval> | undefined;
  private measuring: Promise<void> | undefined;
  private jsm: Promise<JetStreamManager> | undefined;
  /** Called with the names of the full stores after each measure that changes them. */
  onFull: ((full: string[]) => void) | undefined;
  private lastFull = "";
  /** Bytes this process added to a store since the measure under way or last made began. */
  private added = new Map<string, number>();
  /** Stores hasRoom() said no for since the measure under way or last made began. */
  private refused = new Set<string>();
  private fullNow: string[] = [];

  constructor(
    private readonly nc: NatsConnection,
    private readonly logger: Logger,
    private readonly everyMs = WATCH_EVERY_MS,
  ) {}

  /** Adds a store that JetStream does not hold (the run history); returns a function that removes it. */
  addStore(store: string, budget: number, measure: StoreMeasure): () => void {
    const spec = STORE_SPECS.find((s) => s.store === store);
    if (spec === undefined) throw new Error(`no store named ${store}`);
    this.extra.set(store, { spec, budget, measure });
    return () => {
      this.extra.delete(store);
      this.usage.delete(store);
    };
  }

  start(): this {
    void this.measure();
    this.timer = setInterval(() => void this.measure(), this.everyMs);
    this.timer.unref();
    return this;
  }

  stop(): Promise<void> {
    clearInterval(this.timer);
    return this.measuring ?? Promise.resolve();
  }

  /** Every store as last measured, by name. */
  snapshot(): StoreUsage[] {
    return [...this.usage.values()];
  }

  /** One store as last measured. */
  get(store: string): StoreUsage | undefined {
    return this.usage.get(store);
  }

  /**
   * Whether `bytes` more fit a store's budget: its bytes as last measured,
   * plus what this process added since, stay under FULL_AT of it. True for a
   * store not measured yet or without a budget (JetStream still refuses
   * past a budget).
   */
  hasRoom(store: string, bytes: number): boolean {
    const u = this.usage.get(store);
    if (u === undefined || u.budget <= 0) return true;
    const room = u.bytes + (this.added.get(store) ?? 0) + bytes <= u.budget * FULL_AT;
    if (!room) this.refused.add(store);
    return room;
  }

  /** Counts bytes this process stored in a store, until the next measure sees them. */
  add(store: string, bytes: number): void {
    this.added.set(store, (this.added.get(store) ?? 0) + bytes);
  }

  /**
   * Stores that refuse new writes and are (nearly) at their budget, or
   * that hasRoom() refused a write for since the last measure and are still
   * past 80 % of it, as the last measure found them.
   */
  full(): string[] {
    return this.fullNow;
  }

  /** Measures every store now (one round at a time); resolves when done. */
  measure(): Promise<void> {
    return (this.measuring ??= this.measureAll().finally(() => (this.measuring = undefined)));
  }

  private async measureAll(): Promise<void> {
    const next = new Map<string, StoreUsage>();
    // What is added from here on is counted again until the next measure; what came before, this one sees.
    this.added = new Map<string, number>();
    const refused = this.refused;
    this.refused = new Set<string>();
    try {
      const jsm = await (this.jsm ??= this.nc.jetstreamManager().catch((err: unknown) => {
        this.jsm = undefined;
        throw err;
      }));
      // One listing (a page of up to 256 streams a request) rather than a request per store.
      for await (const info of jsm.streams.list()) {
        const spec = specOfStream(info.config.name);
        if (spec === undefined) continue;
        const budget = info.config.max_bytes > 0 ? info.config.max_bytes : 0;
        next.set(spec.store, usageOf(spec, info.state.bytes, budget));
      }
    } catch (err) {
      // NATS away: keep the last figures of the streams; /healthz says NATS is away.
      this.logger.debug({ err }, "store budgets: cannot read the streams");
      for (const [k, u] of this.usage) if (!this.extra.has(k)) next.set(k, u);
    }
    for (const [store, { spec, budget, measure }] of this.extra) {
      try {
        next.set(store, usageOf(spec, await measure(), budget));
      } catch (err) {
        this.logger.debug({ err, store }, "store budgets: cannot measure a store");
        const last = this.usage.get(store);
        if (last) next.set(store, last);
      }
    }
    this.usage = next;
    const full = [...next.values()]
      .filter((u) => isFull(u) || (refused.has(u.store) && u.budget > 0 && u.bytes >= u.budget * WARN_AT))
      .map((u) => u.store);
    this.fullNow = full;
    for (const u of next.values()) this.judge(u, full.includes(u.store));
    if (full.join() !== this.lastFull) {
      this.lastFull = full.join();
      this.onFull?.(full);
    }
  }

  private judge(u: StoreUsage, full: boolean): void {
    if (u.budget <= 0) return;
    const part = u.bytes / u.budget;
    if (part >= WARN_AT && !this.warned.has(u.store)) {
      this.warned.add(u.store);
      const what =
        u.atBudget === "drops oldest"
          ? "at its budget its oldest entries are dropped first"
          : "at its budget it refuses new writes";
      const log = full ? this.logger.error.bind(this.logger) : this.logger.warn.bind(this.logger);
      log(
        { store: u.store, kind: u.kind, bytes: u.bytes, budget: u.budget, percent: Math.round(part * 100) },
        `${u.kind} ${u.store} holds ${Math.round(part * 100)} % of its budget (${mib(u.bytes)} of ${mib(u.budget)}, ${settingOf(u.store)}); ${what}`,
      );
    } else if (part < WARN_AT - 0.1) this.warned.delete(u.store);
  }
}

function usageOf(spec: StoreSpec, bytes: number, budget: number): StoreUsage {
  return { store: spec.store, kind: spec.kind, atBudget: spec.atBudget, bytes, budget };
}

function isFull(u: StoreUsage): boolean {
  return u.atBudget === "refuses new" && u.budget > 0 && u.bytes >= u.budget * FULL_AT;
}

function settingOf(store: string): string {
  return STORE_SPECS.find((s) => s.store === store)?.setting ?? "";
}

/** Bytes as MiB, for messages. */
export function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(bytes < 10 * 2 ** 20 ? 1 : 0)} MiB`;
}
