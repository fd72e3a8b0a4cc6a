// Every NATS name skiff uses: subjects, JetStream streams, KV buckets and
// object stores. Provisioning (nats.ts) creates exactly what is listed here.

const DAY_MS = 24 * 60 * 60 * 1000;

/** Subject tokens may not contain ".", "*", ">" or whitespace; ids and names here never do. */
export const subjects = {
  /** Sync dispatch, request/reply, queue group `runners`. */
  invoke: (project: string, app: string) => `skiff.invoke.${project}.${app}`,
  invokeQueueGroup: "runners",
  /** Accepted async runs (work queue). */
  runQueue: (project: string, app: string) => `skiff.runs.queue.${project}.${app}`,
  runQueueAll: "skiff.runs.queue.>",
  /** Public run lifecycle events. */
  runEvent: (project: string, app: string, status: string) => `skiff.events.runs.${project}.${app}.${status}`,
  runEventsAll: "skiff.events.runs.>",
  eventsAll: "skiff.events.>",
  /** App log lines (replica stdout/stderr), one subject per app. */
  appLogs: (project: string, app: string) => `skiff.logs.${project}.${app}`,
  appLogsAll: "skiff.logs.>",
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
    duplicateWindowMs: DAY_MS,
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

/**
 * How long run records and webhook delivery records are kept after their
 * last change; the run index forgets runs of that age too.
 */
export const RUN_RETENTION_MS = 30 * DAY_MS;

export interface BucketSpec {
  name: string;
  /** 0 = values never expire. */
  ttlMs: number;
  history: number;
  description: string;
}

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
  runs: { name: "skiff-runs", ttlMs: RUN_RETENTION_MS, history: 1, description: "run records" },
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
    history: 1,
    description: "webhook deliveries and their attempts",
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
