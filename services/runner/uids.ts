// The uids sandboxes run as, from KV `skiff-uids`, shared by every process.
// Where skiff runs as root a sandbox's uid is a real host uid: two projects
// on one uid share its process limit (RLIMIT_NPROC) and may signal each
// other's processes, so each project needs a uid of its own, and one uid
// must never pass from a project to another.
//
// The bucket holds `next`, the next free uid, and `project.<id>`, the uid of
// each project. A uid is taken by raising `next` by one with compare-and-set,
// then written to the project's key with create-if-absent (a deleted key
// counts as absent); a process that loses that race reads the winner's uid,
// and the one it took stays unused.
// `next` only grows, so no uid is given twice, not even after a project's key
// is deleted. Builds do not take uids here: each runs as a uid of the range
// above UID_LIMIT (sandbox.ts buildUid), and owns nothing once it has ended
// (build-area.ts).
import { createHash, randomInt } from "node:crypto";
import type { KV, NatsConnection } from "nats";
import { buckets, kvGetLatest, type KvGetEntry } from "../nats/index.js";
import { isWrongRevision } from "../runs/index.js";

/** The first uid given out. */
export const FIRST_UID = 200_000;
/** Uids stay below it: deploy-time steps' hashed uids (sandbox.ts buildUid) start here. */
export const UID_LIMIT = 1_300_000;

/**
 * Where a new registry starts counting: FIRST_UID plus a random multiple of
 * 1,000 below 500,000, so that two skiff installs on one machine (each with
 * its registry) do not both begin at the same uid and share its process
 * limit. At least 600,000 uids stay above it.
 */
const firstUid = (): number => FIRST_UID + 1000 * randomInt(0, 500);

/** The key of the counter. */
const NEXT_KEY = "next";
/** A project id makes one token of a KV key: letters, digits, "_" and "-". */
const PROJECT_ID = /^[A-Za-z0-9_-]{1,128}$/;
/** Compare-and-set attempts of one allocation before it gives up (each lost one means another process moved on). */
const MAX_ATTEMPTS = 100;

/** What a Runner needs: the uid of a project's replicas. */
export interface ProjectUids {
  projectUid(projectId: string): Promise<number>;
}

/** Every uid below UID_LIMIT has been given out. */
export class UidsExhausted extends Error {
  override name = "UidsExhausted";
}

export function projectKey(projectId: string): string {
  if (!PROJECT_ID.test(projectId))
    throw new Error(`cannot give a sandbox uid to project ${JSON.stringify(projectId)}: not a valid project id`);
  return `project.${projectId}`;
}

export class UidRegistry implements ProjectUids {
  /** Answers and allocations under way, by project: a project's uid never changes once written. */
  private readonly known = new Map<string, Promise<number>>();
  private readonly bucket = buckets.uids.name;
  /** The end of the last raise of the counter (take), which the next one waits for. */
  private turn: Promise<unknown> = Promise.resolve();
  /** The counter's value and revision as this process last wrote them. */
  private counter: { uid: number; revision: number } | undefined;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly kv: KV,
  ) {}

  /** Binds to the provisioned bucket. */
  static async open(nc: NatsConnection): Promise<UidRegistry> {
    return new UidRegistry(nc, await nc.jetstream().views.kv(buckets.uids.name, { bindOnly: true }));
  }

  /** The project's uid, allocated on first use; calls for one project while it is allocated share that one allocation. */
  projectUid(projectId: string): Promise<number> {
    let answer = this.known.get(projectId);
    if (answer) return answer;
    let key: string;
    try {
      key = projectKey(projectId);
    } catch (err) {
      return Promise.reject(err as Error);
    }
    answer = this.lookUp(key).catch((err: unknown) => {
      // A failure is not an answer: the next call asks again.
      this.known.delete(projectId);
      throw new Error(`cannot get the sandbox uid of project ${projectId}: ${(err as Error).message}`, { cause: err });
    });
    this.known.set(projectId, answer);
    return answer;
  }

  private async lookUp(key: string): Promise<number> {
    for (let attempt = 1; ; attempt++) {
      const entry = await this.read(key);
      if (entry?.operation === "PUT") return this.uidOf(key, entry);
      if (attempt > MAX_ATTEMPTS) throw new Error(`${key} kept changing under ${MAX_ATTEMPTS} attempts to write it`);
      const uid = await this.take();
      try {
        // Absent: create it; deleted: write over the deletion marker, expecting it to be the latest entry still.
        await this.kv.put(key, String(uid), { previousSeq: entry?.revision ?? 0 });
        return uid;
      } catch (err) {
        // Another process wrote the key first: the next turn reads its uid.
        if (!isWrongRevision(err)) throw err;
      }
    }
  }

  /**
   * Takes the next free uid off the counter. One process raises it one call
   * at a time, so compare-and-sets are lost only to other processes.
   */
  private take(): Promise<number> {
    const uid = this.turn.then(() => this.raise());
    this.turn = uid.catch(() => undefined);
    return uid;
  }

  private async raise(): Promise<number> {
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      // The counter as this process last wrote it, read again only when another process wrote since.
      let entry = this.counter;
      if (!entry) {
        const read = await this.read(NEXT_KEY);
        if (read && read.operation !== "PUT")
          // Starting again from FIRST_UID would give out uids that projects hold.
          throw new Error(`key ${NEXT_KEY} of KV ${this.bucket} was deleted; refusing to number uids again`);
        entry = read && { uid: this.uidOf(NEXT_KEY, read, UID_LIMIT), revision: read.revision };
      }
      const uid = entry?.uid ?? firstUid();
      if (uid >= UID_LIMIT)
        throw new UidsExhausted(
          `no sandbox uid left: every uid from ${FIRST_UID} to ${UID_LIMIT - 1} has been given out (KV ${this.bucket})`,
        );
      try {
        const revision = await this.kv.put(NEXT_KEY, String(uid + 1), { previousSeq: entry?.revision ?? 0 });
        this.counter = { uid: uid + 1, revision };
        return uid;
      } catch (err) {
        this.counter = undefined;
        if (!isWrongRevision(err)) throw err;
        // Another process took this one: try again after a short random pause, so that two do not keep colliding.
        if (attempt > 1) await new Promise((resolve) => setTimeout(resolve, Math.random() * 5 * attempt));
      }
    }
    throw new Error(`key ${NEXT_KEY} of KV ${this.bucket} kept changing under ${MAX_ATTEMPTS} attempts to raise it`);
  }

  /** The latest entry, from the bucket's stream leader: after a lost compare-and-set it shows the winner's write. */
  private read(key: string): Promise<KvGetEntry | undefined> {
    return kvGetLatest(this.nc, this.bucket, key);
  }

  /** The uid a key holds; `max` is the highest value it may hold (UID_LIMIT for the counter, which may reach it). */
  private uidOf(key: string, entry: KvGetEntry, max = UID_LIMIT - 1): number {
    const text = new TextDecoder().decode(entry.value);
    const uid = /^\d{1,10}$/.test(text) ? Number(text) : NaN;
    if (!(uid >= FIRST_UID && uid <= max))
      throw new Error(`key ${key} of KV ${this.bucket} holds ${JSON.stringify(text.slice(0, 20))}, not a uid`);
    return uid;
  }
}

/**
 * Uids hashed from project ids, for a Runner given no registry: tests and
 * benches without NATS, a few projects in one process. Two projects may share
 * one (p-team354 and p-team1585 do), so the runner role always passes a
 * UidRegistry.
 */
export const hashedUids: ProjectUids = {
  projectUid: async (projectId) =>
    FIRST_UID + (createHash("sha256").update(projectId).digest().readUInt32BE(0) % 1_000_000),
};
