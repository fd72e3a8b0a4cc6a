// Every NATS name skiff uses: subjects, JetStream streams and their durable
// consumers, KV buckets and object stores. Provisioning (provision.ts)
// creates exactly the streams, buckets and object stores listed here; each
// consumer is ensured (consumers.ts) by the role that works it.

const DAY_MS = 24 * 60 * 60 * 1000;

/** Subject tokens may not contain ".", "*", ">" or whitespace; ids and names here never do. */
export const subjects = {
  /** Sync dispatch, request/reply, queue group `runners` (runner-client/nats.ts). */
  invoke: (project: string, app: string) => `skiff.invoke.${project}.${app}`,
  invokeQueueGroup: "runners",
  /** Accepted async runs (work queue). */
  runQueue: (project: string, app: string) => `skiff.runs.queue.${project}.${app}`,
  runQueueAll: "skiff.runs.queue.>",
  /** Public run lifecycle events. */
  runEvent: (project: string, app: string, status: string) => `skiff.events.runs.${project}.${app}.${status}`,
  runEventsAll: "skiff.events.runs.>",
  eventsAll: "skiff.events.>",
  /**
   * The terminal events of runs that named a webhook, on a subject of their
   * own, so the webhook role never pulls or decodes the runs that want none.
   */
  webhookRun: (project: string, app: string) => `skiff.webhooks.runs.${project}.${app}`,
  webhookRunsAll: "skiff.webhooks.runs.>",
  /**
   * A webhook delivery that is over (delivered or failed), its record in
   * header `Skiff-Delivery`: stored in SKIFF_EVENTS for the run history,
   * which keeps it once its KV entry is gone. Not a public event.
   */
  deliveryRecord: (project: string, app: string) => `skiff.history.delivered.${project}.${app}`,
  deliveryRecordsAll: "skiff.history.delivered.>",
  /** Where an earlier version stored them, in SKIFF_EVENTS: the run history reads those once. */
  earlierDeliveryRecordsAll: "skiff.history.deliveries.>",
  /**
   * Run records for the run history, many a message (runs/record-feed.ts): each the record a run event's
   * `Skiff-Run` header carries, published after the events of the same write. Not a public event.
   */
  historyRuns: "skiff.history.runs",
  /** App log lines (replica stdout/stderr), one subject per app. */
  appLogs: (project: string, app: string) => `skiff.logs.${project}.${app}`,
  appLogsAll: "skiff.logs.>",
  /** WebSocket handshakes from a gateway without the app's runner, request/reply, queue group `runners`. */
  wsOpen: (project: string, app: string) => `skiff.ws.open.${project}.${app}`,
  /**
   * One byte stream between a gateway and a runner (runner-client/byte-stream.ts): a run's streamed body
   * and answer, or a WebSocket's bytes; `up` from the gateway to the runner, `down` back.
   */
  runStream: (id: string, direction: "up" | "down") => `skiff.stream.${id}.${direction}`,
  /** Control messages between processes (cancel a running run, app changes). */
  control: (topic: string) => `skiff.control.${topic}`,
} as const;

export interface StreamSpec {
  name: string;
  subjects: string[];
  retention: "workqueue" | "limits";
  /** 0 = no age limit. */
  maxAgeMs: number;
  /** Window in which a repeated Nats-Msg-Id is dropped. */
  duplicateWindowMs: number;
  /** Messages kept per subject, oldest dropped first; -1 = no limit. */
  maxMsgsPerSubject: number;
  description: string;
}

export const streams = {
  runs: {
    name: "SKIFF_RUNS",
    subjects: [subjects.runQueueAll],
    retention: "workqueue",
    maxAgeMs: 0,
    // Long enough for a gateway's repeated publish; the server holds every id of the window in memory.
    duplicateWindowMs: 2 * 60 * 1000,
    maxMsgsPerSubject: -1,
    description: "accepted async runs; Nats-Msg-Id = run id",
  },
  events: {
    name: "SKIFF_EVENTS",
    subjects: [subjects.eventsAll],
    retention: "limits",
    maxAgeMs: 7 * DAY_MS,
    duplicateWindowMs: 2 * 60 * 1000,
    maxMsgsPerSubject: -1,
    description: "public run lifecycle events (skiff.events.v1)",
  },
  history: {
    name: "SKIFF_HISTORY",
    // A stream of its own: a consumer filtered to a few subjects of the events' stream would make the server
    // step over every event to find them.
    subjects: [subjects.historyRuns, subjects.deliveryRecordsAll],
    retention: "limits",
    // As long as the events: the run history catches up from it after a long stop.
    maxAgeMs: 7 * DAY_MS,
    duplicateWindowMs: 2 * 60 * 1000,
    maxMsgsPerSubject: -1,
    description: "the run history's input: run records, many a message, and webhook deliveries that are over",
  },
  webhooks: {
    name: "SKIFF_WEBHOOKS",
    subjects: [subjects.webhookRunsAll],
    retention: "limits",
    // As long as the events: a redelivery may still read a large result until then.
    maxAgeMs: 7 * DAY_MS,
    duplicateWindowMs: 2 * 60 * 1000,
    maxMsgsPerSubject: -1,
    description: "terminal events of runs that named a webhook, the webhook role's input",
  },
  lostRuns: {
    name: "SKIFF_LOST_RUNS",
    // JetStream's own advisory, kept: it may fire while no runner is up to hear it (run-advisories.ts).
    subjects: ["$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.SKIFF_RUNS.*"],
    retention: "workqueue",
    maxAgeMs: 7 * DAY_MS,
    duplicateWindowMs: 2 * 60 * 1000,
    maxMsgsPerSubject: -1,
    description: "MAX_DELIVERIES advisories of async runs, until a runner has failed the run (runner_lost)",
  },
  logs: {
    name: "SKIFF_LOGS",
    subjects: [subjects.appLogsAll],
    retention: "limits",
    maxAgeMs: DAY_MS,
    duplicateWindowMs: 2 * 60 * 1000,
    // Per app: one chatty app cannot push the others' lines out.
    maxMsgsPerSubject: 10_000,
    description: "app log lines (JSON), one subject per app",
  },
} as const satisfies Record<string, StreamSpec>;

/** Deliveries of one async run at most: the first try and two retries after a lost runner. */
export const MAX_RUN_ATTEMPTS = 3;

export interface ConsumerSpec {
  stream: string;
  /** Durable name, shared by every process that works the consumer. */
  name: string;
  filterSubject: string;
  /** Deliveries of one message at most; -1 = no limit. */
  maxDeliver: number;
  description: string;
}

/**
 * Durable pull consumers, all with explicit acks, delivering from the start
 * of their stream. Their ack_wait is a setting of the processes that work
 * them (the last one to start sets it).
 */
export const consumers = {
  /** One per app, shared by every runner of the app. */
  runQueue: (project: string, app: string): ConsumerSpec => ({
    stream: streams.runs.name,
    name: `runs-${project}-${app}`,
    filterSubject: subjects.runQueue(project, app),
    maxDeliver: MAX_RUN_ATTEMPTS,
    description: `async runs of ${project}/${app}`,
  }),
  /** Async runs whose every delivery's runner was lost, shared by every runner. */
  lostRuns: {
    stream: "SKIFF_LOST_RUNS",
    name: "skiff-lost-runs",
    filterSubject: "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.SKIFF_RUNS.*",
    maxDeliver: -1,
    description: "async runs to fail as runner_lost",
  },
  /**
   * The terminal events of runs that named a webhook, shared by every
   * webhook process. No max_deliver: naks between attempts count as
   * deliveries, and the delivery record in KV already caps the attempts.
   */
  webhook: {
    stream: streams.webhooks.name,
    name: "skiff-webhook",
    filterSubject: subjects.webhookRunsAll,
    maxDeliver: -1,
    description: "webhook deliveries of terminal run events",
  },
} as const satisfies Record<string, ConsumerSpec | ((project: string, app: string) => ConsumerSpec)>;

/**
 * How long runs are kept: the run history deletes runs of that age (by the
 * time in their ids), and webhook delivery records are kept that long after
 * their last change.
 */
export const RUN_RETENTION_MS = 30 * DAY_MS;

/**
 * How long KV `skiff-runs` keeps an async run's record after its last write,
 * when nothing took it out before: a runner purges a run's record a minute
 * after the run ended (nats/kv-purge.ts), so the age only bounds records
 * whose purge was lost (their runner died). Two days: a run may wait, then
 * run 12 h.
 */
export const RUN_RECORD_TTL_MS = 2 * DAY_MS;

/**
 * How long SKIFF_EVENTS keeps events: a week, or longer when results are
 * kept longer (SKIFF_RESULT_TTL), since GetRun reads an ended async run's
 * result from its terminal event.
 */
export function eventsMaxAgeMs(resultTtlSeconds: number): number {
  return Math.max(streams.events.maxAgeMs, resultTtlSeconds * 1000);
}

export interface BucketSpec {
  name: string;
  /** 0 = values never expire. */
  ttlMs: number;
  history: number;
  description: string;
}

/**
 * History of buckets whose entries are written a few times each (a run's
 * record: queued, running once per attempt, final; a webhook delivery: made,
 * then once per attempt): every revision is kept until the bucket's TTL
 * removes it from the stream's start. With one revision kept, each write
 * would delete the one before from the middle of the stream, and nats-server
 * 2.9 holds every such interior delete in memory until its whole block is
 * gone, so its memory would grow with every rewrite (bench/README.md has the
 * measurement).
 */
export const REWRITTEN_HISTORY = 8;

export const buckets = {
  projects: { name: "skiff-projects", ttlMs: 0, history: 1, description: "projects" },
  serviceAccounts: {
    name: "skiff-service-accounts",
    ttlMs: 0,
    history: 1,
    description: "service accounts; deletions revoke tokens through watches",
  },
  keys: { name: "skiff-keys", ttlMs: 0, history: 1, description: "token signing keys" },
  apps: { name: "skiff-apps", ttlMs: 0, history: 5, description: "apps, their config and deployments" },
  runs: {
    name: "skiff-runs",
    ttlMs: RUN_RECORD_TTL_MS,
    history: REWRITTEN_HISTORY,
    description: "async run records",
  },
  secrets: { name: "skiff-secrets", ttlMs: 2 * DAY_MS, history: 1, description: "sealed webhook secrets (short TTL)" },
  idempotency: { name: "skiff-idempotency", ttlMs: DAY_MS, history: 1, description: "Idempotency-Key to run id, 24 h" },
  replicas: {
    name: "skiff-replicas",
    ttlMs: 30_000,
    history: 1,
    description: "live replicas of every runner process, refreshed well inside the TTL",
  },
  webhooks: {
    name: "skiff-webhooks",
    ttlMs: RUN_RETENTION_MS,
    history: REWRITTEN_HISTORY,
    description: "webhook deliveries and their attempts",
  },
  projectSecrets: {
    name: "skiff-project-secrets",
    ttlMs: 0,
    history: 1,
    description: "project secrets, sealed under the platform key, keyed <project>.<name>",
  },
  uids: {
    name: "skiff-uids",
    ttlMs: 0,
    history: 1,
    description: "sandbox uids: the next free one and each project's (runner/uids.ts); none given twice",
  },
} as const satisfies Record<string, BucketSpec>;

export interface ObjectStoreSpec {
  name: string;
  description: string;
}

export const objectStores = {
  bundles: { name: "skiff-bundles", description: "app bundles" },
  results: { name: "skiff-results", description: "results too large for a KV value or an event" },
} as const satisfies Record<string, ObjectStoreSpec>;
