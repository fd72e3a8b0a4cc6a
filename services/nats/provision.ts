// Creates every stream, KV bucket and object store of layout.ts, and
// brings existing ones back to the layout's settings. Every process runs it at
// start, several at once when a cluster boots, so a lost race is normal:
// whoever loses re-reads what the winner made and carries on.
import {
  ErrorCode,
  NatsError,
  RetentionPolicy,
  StorageType,
  nanos,
  type JetStreamClient,
  type JetStreamManager,
  type NatsConnection,
  type StreamConfig,
  type StreamInfo,
  type StreamUpdateConfig,
} from "nats";
import type { Logger } from "../config/index.js";
import { JsErrorCode, NatsProvisionError, isJsError, jsErrorCode, messageOf } from "./errors.js";
import {
  buckets,
  objectStores,
  eventsMaxAgeMs,
  streams,
  type BucketSpec,
  type ObjectStoreSpec,
  type StreamSpec,
} from "./layout.js";

/** How long one JetStream API call of provisioning may take. */
const PROVISION_TIMEOUT_MS = 30_000;

/** Settings JetStream can change on an existing stream (they are part of StreamUpdateConfig). */
const UPDATABLE = [
  "subjects",
  "description",
  "max_age",
  "duplicate_window",
  "max_msgs_per_subject",
  "num_replicas",
] as const satisfies readonly (keyof StreamUpdateConfig)[];
/** Settings fixed at creation: a difference is reported, never "fixed" by deleting data. */
const FIXED = ["retention", "storage"] as const satisfies readonly (keyof StreamConfig)[];

type Wanted = Pick<StreamConfig, "name" | (typeof FIXED)[number]> &
  Partial<Pick<StreamConfig, (typeof UPDATABLE)[number]>>;

/** One thing to provision: the stream behind it, its settings, and how to create it. */
interface Target {
  kind: "stream" | "KV bucket" | "object store";
  name: string;
  want: Wanted;
  create: () => Promise<unknown>;
}

export interface ProvisionOptions {
  /**
   * SKIFF_NATS_REPLICAS: copies of every stream, bucket and object store, on
   * that many servers of a JetStream cluster (1 on a single server); an
   * existing one is scaled to it. Default 1.
   */
  replicas?: number;
  /** SKIFF_RESULT_TTL, which SKIFF_EVENTS keeps events at least as long as (eventsMaxAgeMs); default a day. */
  resultTtlSeconds?: number;
}

export async function provision(nc: NatsConnection, logger: Logger, opts: ProvisionOptions = {}): Promise<void> {
  const replicas = opts.replicas ?? 1;
  // Placing copies on a cluster's nodes can take longer than an API call's usual 5 s.
  const jsm = await nc.jetstreamManager({ timeout: PROVISION_TIMEOUT_MS });
  const js = nc.jetstream({ timeout: PROVISION_TIMEOUT_MS });
  const targets = [
    ...Object.values(streams).map((spec) =>
      streamTarget(
        jsm,
        spec === streams.events && opts.resultTtlSeconds !== undefined
          ? { ...spec, maxAgeMs: eventsMaxAgeMs(opts.resultTtlSeconds) }
          : spec,
        replicas,
      ),
    ),
    ...Object.values(buckets).map((spec) => bucketTarget(js, spec, replicas)),
    ...Object.values(objectStores).map((spec) => objectStoreTarget(js, spec, replicas)),
  ];
  await Promise.all(targets.map((target) => ensureWithRetries(jsm, target, logger)));
}

/** Attempts at one target when JetStream's API does not answer in time (a cluster busy placing copies). */
const PROVISION_ATTEMPTS = 4;

async function ensureWithRetries(jsm: JetStreamManager, target: Target, logger: Logger): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await ensure(jsm, target, logger);
    } catch (err) {
      const cause = err instanceof NatsProvisionError ? err.cause : err;
      if (attempt >= PROVISION_ATTEMPTS || !(cause instanceof NatsError && cause.code === ErrorCode.Timeout)) throw err;
      logger.warn(
        { kind: target.kind, name: target.name, attempt },
        `${target.kind} ${target.name}: JetStream did not answer in time; trying again`,
      );
      await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
    }
  }
}

function streamTarget(jsm: JetStreamManager, spec: StreamSpec, replicas: number): Target {
  const want: Wanted = {
    name: spec.name,
    num_replicas: replicas,
    subjects: [...spec.subjects],
    retention: spec.retention === "workqueue" ? RetentionPolicy.Workqueue : RetentionPolicy.Limits,
    storage: StorageType.File,
    max_age: nanos(spec.maxAgeMs),
    duplicate_window: nanos(spec.duplicateWindowMs),
    max_msgs_per_subject: spec.maxMsgsPerSubject,
    description: spec.description,
  };
  return { kind: "stream", name: spec.name, want, create: () => jsm.streams.add(want) };
}

// KV buckets and object stores are created through nats.js so that their
// streams get exactly the subjects and flags the client expects to find.
function bucketTarget(js: JetStreamClient, spec: BucketSpec, replicas: number): Target {
  const want: Wanted = {
    name: `KV_${spec.name}`,
    num_replicas: replicas,
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    max_msgs_per_subject: spec.history,
    max_age: nanos(spec.ttlMs),
    description: spec.description,
  };
  const create = () =>
    js.views.kv(spec.name, {
      history: spec.history,
      ttl: spec.ttlMs,
      storage: StorageType.File,
      description: spec.description,
      replicas,
    });
  return { kind: "KV bucket", name: spec.name, want, create };
}

function objectStoreTarget(js: JetStreamClient, spec: ObjectStoreSpec, replicas: number): Target {
  const want: Wanted = {
    name: `OBJ_${spec.name}`,
    num_replicas: replicas,
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    description: spec.description,
  };
  const create = () => js.views.os(spec.name, { storage: StorageType.File, description: spec.description, replicas });
  return { kind: "object store", name: spec.name, want, create };
}

async function ensure(jsm: JetStreamManager, target: Target, logger: Logger): Promise<void> {
  try {
    const existing = await streamInfo(jsm, target.want.name);
    if (existing !== undefined) return await reconcile(jsm, target, existing, logger);
    try {
      await target.create();
      logger.info({ kind: target.kind, name: target.name }, `created ${target.kind} ${target.name}`);
    } catch (err) {
      // Another process created it between our look and our create, with other
      // settings (an identical create succeeds), or while ours was under way
      // (the server then may say the subjects overlap). Settle it like an existing one.
      const code = jsErrorCode(err);
      if (code !== JsErrorCode.StreamNameInUse && code !== JsErrorCode.StreamSubjectOverlap) throw err;
      const winner = await streamInfo(jsm, target.want.name);
      if (winner === undefined) throw err;
      await reconcile(jsm, target, winner, logger);
    }
  } catch (err) {
    if (err instanceof NatsProvisionError) throw err;
    throw new NatsProvisionError(`cannot provision ${target.kind} ${target.name}: ${messageOf(err)}`, { cause: err });
  }
}

async function streamInfo(jsm: JetStreamManager, name: string): Promise<StreamInfo | undefined> {
  try {
    return await jsm.streams.info(name);
  } catch (err) {
    if (isJsError(err, JsErrorCode.StreamNotFound)) return undefined;
    throw err;
  }
}

/** Updates what JetStream lets us update; reports what it does not. */
async function reconcile(jsm: JetStreamManager, target: Target, info: StreamInfo, logger: Logger): Promise<void> {
  const fixed = FIXED.filter((key) => info.config[key] !== target.want[key]);
  if (fixed.length > 0) {
    logger.warn(
      { kind: target.kind, name: target.name, have: pick(info.config, fixed), want: pick(target.want, fixed) },
      `${target.kind} ${target.name} differs from the layout in settings JetStream cannot change (${fixed.join(", ")}); using it as it is`,
    );
  }
  const changed = UPDATABLE.filter(
    (key) => target.want[key] !== undefined && !sameValue(info.config[key], target.want[key]),
  );
  if (changed.length === 0) return;
  const update = pick(target.want, changed) as Partial<StreamUpdateConfig>;
  try {
    await jsm.streams.update(target.want.name, update);
  } catch (err) {
    throw new NatsProvisionError(
      `cannot update ${changed.join(", ")} of ${target.kind} ${target.name}: ${messageOf(err)}`,
      { cause: err },
    );
  }
  logger.info(
    { kind: target.kind, name: target.name, was: pick(info.config, changed), now: update },
    `updated ${target.kind} ${target.name}`,
  );
}

function sameValue(have: unknown, want: unknown): boolean {
  if (Array.isArray(have) && Array.isArray(want)) {
    return have.length === want.length && [...have].sort().join("\n") === [...want].sort().join("\n");
  }
  return have === want;
}

function pick<T extends object, K extends keyof T>(obj: T, keys: readonly K[]): Partial<Pick<T, K>> {
  return Object.fromEntries(keys.map((key) => [key, obj[key]])) as Partial<Pick<T, K>>;
}
