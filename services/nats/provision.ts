// Creates every stream, KV bucket and object store of layout.ts, and
// brings existing ones back to the layout's settings. Every process runs it at
// start, several at once when a cluster boots, so a lost race is normal:
// whoever loses re-reads what the winner made and carries on.
//
// With budgets (budgets.ts), every stream gets its `max_bytes`: the setting's,
// or, unset, the one it already has, or, with none yet, its share of the free
// space on SKIFF_DATA_DIR's disk, said in the log. Streams whose oldest
// messages may go discard old at it; the run queue, the buckets and the object
// stores discard new (refuse), so nothing accepted is ever dropped.
import {
  DiscardPolicy,
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
import { MIN_STORE_BUDGET_BYTES, type Logger } from "../config/index.js";
import {
  derivedBudget,
  explicitBudget,
  freeDiskBytes,
  mib,
  specOfStream,
  type BudgetPlan,
  type StoreSpec,
} from "./budgets.js";
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
  "max_bytes",
  "discard",
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
  /** Its budget: the store's spec, and the budget its setting gives (undefined: kept, or derived). */
  budget?: {
    spec: StoreSpec;
    explicit: number | undefined;
    /** Its share of the free disk. */
    derived: () => Promise<number>;
    /** Whether this provisioning derived it (rather than keeping the stream's). */
    derivedHere?: boolean;
  };
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
  /** The byte budgets of the streams, buckets and object stores; without, none is given or changed. */
  budgets?: BudgetPlan;
}

export async function provision(nc: NatsConnection, logger: Logger, opts: ProvisionOptions = {}): Promise<void> {
  const replicas = opts.replicas ?? 1;
  // Placing copies on a cluster's nodes can take longer than an API call's usual 5 s.
  // Its first request (JetStream's account info) is retried as every other: a fresh server under load can lose one.
  const jsm = await retryingTimeouts(() => nc.jetstreamManager({ timeout: PROVISION_TIMEOUT_MS }), logger, "JetStream");
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
  const plan = opts.budgets;
  const scale = { now: 1 };
  if (plan !== undefined) {
    let free: Promise<number> | undefined;
    for (const target of targets) {
      const spec = specOfStream(target.want.name);
      if (spec === undefined) continue;
      target.budget = {
        spec,
        explicit: explicitBudget(spec, plan.settings),
        derived: async () =>
          Math.max(
            MIN_STORE_BUDGET_BYTES,
            Math.floor(
              scale.now * derivedBudget(spec, plan.settings.storageShare, await (free ??= freeDiskBytes(plan.dataDir))),
            ),
          ),
      };
      // JetStream's own kind for each: a KV bucket or object store is refused at its budget, as nats.js makes them.
      target.want.discard = spec.atBudget === "drops oldest" ? DiscardPolicy.Old : DiscardPolicy.New;
    }
  }
  // A NATS server reserves every stream's max_bytes in its store: when it cannot reserve the derived budgets,
  // they are all halved together (those already made shrink too), so each keeps its part.
  for (let halvings = 0; ; halvings++) {
    const results = await Promise.allSettled(targets.map((target) => ensureWithRetries(jsm, target, logger)));
    const failed = results.flatMap((r, i) => (r.status === "rejected" ? [[targets[i], r.reason] as const] : []));
    if (failed.length === 0) return;
    const [target, err] =
      failed.find(([t, e]) => !cannotReserve(t, e) || t.budget?.explicit !== undefined) ?? failed[0];
    if (!cannotReserve(target, err) || target.budget?.explicit !== undefined || halvings >= RESERVE_HALVINGS) {
      if (!cannotReserve(target, err)) throw err;
      const b = target.budget!;
      throw new NatsProvisionError(
        `${target.kind} ${target.name}: the NATS server cannot reserve ${mib(target.want.max_bytes ?? 0)} of storage for its budget` +
          (b.explicit !== undefined
            ? `; lower ${b.spec.setting}, or give the NATS server more (its jetstream max_file_store)`
            : `; set ${b.spec.setting} and the other budgets (docs/deploy.md, "Storage budgets")`),
        { cause: err instanceof NatsProvisionError ? err.cause : err },
      );
    }
    scale.now /= 2;
    logger.warn(
      { stores: failed.map(([t]) => t.name), scale: scale.now },
      `the NATS server cannot reserve the budgets of ${failed.map(([t]) => t.name).join(", ")}; every derived budget is halved (SKIFF_*_MAX_BYTES set them)`,
    );
  }
}

/** Times the derived budgets are halved together before provisioning gives up. */
const RESERVE_HALVINGS = 12;

/** Whether provisioning `target` failed because the NATS server cannot reserve its budget. */
function cannotReserve(target: Target, err: unknown): boolean {
  const cause = err instanceof NatsProvisionError ? err.cause : err;
  return target.budget !== undefined && isJsError(cause, JsErrorCode.InsufficientResources);
}

/** Attempts at one target when JetStream's API does not answer in time (a cluster busy placing copies). */
const PROVISION_ATTEMPTS = 4;

function ensureWithRetries(jsm: JetStreamManager, target: Target, logger: Logger): Promise<void> {
  return retryingTimeouts(() => ensure(jsm, target, logger), logger, `${target.kind} ${target.name}`);
}

/** `call`, tried again (PROVISION_ATTEMPTS in all) when JetStream's API did not answer it in time. */
async function retryingTimeouts<T>(call: () => Promise<T>, logger: Logger, what: string): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      const cause = err instanceof NatsProvisionError ? err.cause : err;
      if (attempt >= PROVISION_ATTEMPTS || !(cause instanceof NatsError && cause.code === ErrorCode.Timeout)) throw err;
      logger.warn({ what, attempt }, `${what}: JetStream did not answer in time; trying again`);
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
      ...(want.max_bytes !== undefined ? { max_bytes: want.max_bytes } : {}),
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
  const create = () =>
    js.views.os(spec.name, {
      storage: StorageType.File,
      description: spec.description,
      replicas,
      ...(want.max_bytes !== undefined ? { max_bytes: want.max_bytes } : {}),
    });
  return { kind: "object store", name: spec.name, want, create };
}

/** Sets the target's `max_bytes`: the setting's, else the one the stream has, else its share of the free disk. */
async function chooseBudget(target: Target, existing: StreamInfo | undefined, logger: Logger): Promise<void> {
  const b = target.budget;
  if (b === undefined) return;
  if (b.explicit !== undefined) {
    target.want.max_bytes = b.explicit;
    return;
  }
  const kept = existing?.config.max_bytes ?? -1;
  if (kept > 0 && !b.derivedHere) {
    target.want.max_bytes = kept;
    return;
  }
  const bytes = await b.derived();
  target.want.max_bytes = bytes;
  b.derivedHere = true;
  logger.info(
    { kind: target.kind, name: target.name, budget: bytes, setting: b.spec.setting, atBudget: b.spec.atBudget },
    `${target.kind} ${target.name}: budget ${mib(bytes)}, its part of SKIFF_STORAGE_SHARE of the free space on the data folder's disk, kept from now on (${b.spec.setting} sets another); at it, it ${b.spec.atBudget}`,
  );
}

async function ensure(jsm: JetStreamManager, target: Target, logger: Logger): Promise<void> {
  try {
    const existing = await streamInfo(jsm, target.want.name);
    await chooseBudget(target, existing, logger);
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
      // The winner's budget stands unless a setting names another.
      if (target.budget?.explicit === undefined && winner.config.max_bytes > 0)
        target.want.max_bytes = winner.config.max_bytes;
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
