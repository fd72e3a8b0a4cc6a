// What a process counts, for Prometheus: one registry per process (tests run
// several skiffs in one process), the metrics every role records into, and
// gauges read at scrape time through sources the roles register. Served as
// text on GET /metrics (server/), guarded by a token.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";

export const METRICS_CONTENT_TYPE = Registry.PROMETHEUS_CONTENT_TYPE;

/** Latency buckets in seconds: from a fast proxy hop to a long run. */
const REQUEST_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const RUN_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 43200];

/** A gauge's values, read when Prometheus scrapes: label values and the number. */
type GaugeSource = () =>
  Iterable<[Record<string, string>, number]> | Promise<Iterable<[Record<string, string>, number]>>;

/** One store's bytes and byte budget (0: none), by its name and kind. */
export interface StoreFigure {
  store: string;
  kind: string;
  bytes: number;
  budget: number;
}
/** The stores' figures, read when Prometheus scrapes. */
export type StoreSource = () => Iterable<StoreFigure>;

export class Metrics {
  readonly registry = new Registry();

  /** Every HTTP request the port answered: `route` is the API route or RPC method, never the raw path. */
  readonly requests = new Counter({
    name: "skiff_http_requests_total",
    help: "HTTP requests answered, by route, method and status code",
    labelNames: ["route", "method", "code"] as const,
    registers: [this.registry],
  });
  readonly requestDuration = new Histogram({
    name: "skiff_http_request_duration_seconds",
    help: "Time from a request's arrival to the end of its answer, by route",
    labelNames: ["route"] as const,
    buckets: REQUEST_BUCKETS,
    registers: [this.registry],
  });
  /** Runs that reached a final state, recorded by whoever wrote the final record. */
  readonly runs = new Counter({
    name: "skiff_runs_total",
    help: "Runs that ended, by project, app, final status and mode (sync or async)",
    labelNames: ["project", "app", "status", "mode"] as const,
    registers: [this.registry],
  });
  readonly runDuration = new Histogram({
    name: "skiff_run_duration_seconds",
    help: "Run time of ended runs (the app's part), by project, app and mode",
    labelNames: ["project", "app", "mode"] as const,
    buckets: RUN_BUCKETS,
    registers: [this.registry],
  });
  readonly webhookAttempts = new Counter({
    name: "skiff_webhook_attempts_total",
    help: "Webhook delivery attempts, by outcome (delivered, retry, failed)",
    labelNames: ["outcome"] as const,
    registers: [this.registry],
  });
  /** WebSocket connections to apps open through this process. */
  readonly websockets = new Gauge({
    name: "skiff_websocket_connections",
    help: "WebSocket connections to apps open through this process, by project and app",
    labelNames: ["project", "app"] as const,
    registers: [this.registry],
  });
  /** Log lines of replicas past SKIFF_REPLICA_LOG_LINES_PER_SECOND, dropped by this process's runner. */
  readonly logLinesDropped = new Counter({
    name: "skiff_app_log_lines_dropped_total",
    help: "Log lines of replicas dropped past SKIFF_REPLICA_LOG_LINES_PER_SECOND, by project and app",
    labelNames: ["project", "app"] as const,
    registers: [this.registry],
  });
  readonly natsReconnects = new Counter({
    name: "skiff_nats_reconnects_total",
    help: "Times this process reconnected to NATS",
    registers: [this.registry],
  });

  private readonly queueSources = new Set<GaugeSource>();
  private readonly replicaSources = new Set<GaugeSource>();
  private readonly storeSources = new Set<StoreSource>();

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: "skiff_" });
    const sources = (set: Set<GaugeSource>) =>
      async function (this: Gauge<string>) {
        this.reset();
        for (const source of set) for (const [labels, value] of await source()) this.set(labels, value);
      };
    new Gauge({
      name: "skiff_queue_depth",
      help: "Async runs waiting or running, per app (read from the app's queue consumer at scrape time)",
      labelNames: ["project", "app"] as const,
      registers: [this.registry],
      collect: sources(this.queueSources),
    });
    new Gauge({
      name: "skiff_replicas",
      help: "Replicas of this process's runner, by app and state",
      labelNames: ["project", "app", "state"] as const,
      registers: [this.registry],
      collect: sources(this.replicaSources),
    });
    const stores = (figure: (f: StoreFigure) => number) =>
      function (this: Gauge<string>) {
        this.reset();
        for (const source of storeSources)
          for (const f of source()) this.set({ store: f.store, kind: f.kind }, figure(f));
      };
    const storeSources = this.storeSources;
    new Gauge({
      name: "skiff_store_bytes",
      help: "Bytes each store holds (streams, KV buckets, object stores, the run history), as last measured",
      labelNames: ["store", "kind"] as const,
      registers: [this.registry],
      collect: stores((f) => f.bytes),
    });
    new Gauge({
      name: "skiff_store_budget_bytes",
      help: "Byte budget of each store (SKIFF_*_MAX_BYTES); 0: none",
      labelNames: ["store", "kind"] as const,
      registers: [this.registry],
      collect: stores((f) => f.budget),
    });
  }

  /** A run reached its final state. */
  runEnded(project: string, app: string, status: string, async: boolean, runTimeMs: number): void {
    const mode = async ? "async" : "sync";
    this.runs.inc({ project, app, status, mode });
    this.runDuration.observe({ project, app, mode }, runTimeMs / 1000);
  }

  /** Registers a reader of queue depths; returns a function that removes it. */
  queueDepths(source: GaugeSource): () => void {
    this.queueSources.add(source);
    return () => this.queueSources.delete(source);
  }

  /** Registers a reader of replica counts; returns a function that removes it. */
  replicaCounts(source: GaugeSource): () => void {
    this.replicaSources.add(source);
    return () => this.replicaSources.delete(source);
  }

  /** Registers a reader of the stores' bytes and budgets; returns a function that removes it. */
  storeFigures(source: StoreSource): () => void {
    this.storeSources.add(source);
    return () => this.storeSources.delete(source);
  }

  /** The exposition text. */
  text(): Promise<string> {
    return this.registry.metrics();
  }
}
