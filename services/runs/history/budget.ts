// The run history's byte budget (SKIFF_HISTORY_MAX_BYTES), enforced by
// deleting its oldest runs: SQL has no `max_bytes`. The files of a table do
// not shrink when rows are deleted (only VACUUM FULL, which locks the table,
// gives space back); what VACUUM frees is reused by the rows written next.
// So the budget is kept by a row cap: the rows that fit PRUNE_TO of it, at
// the bytes a row takes, measured whenever the tables grow past their
// largest size so far (their files are then full of rows, dead versions of
// updated ones included, so the figure is on the safe side). Runs beyond the
// cap, oldest first, are deleted, then the tables are vacuumed, so that what
// comes next fills the room they left instead of growing the files. Files
// that pass the budget all the same (dead versions and index pages a plain
// VACUUM cannot give back, most with a small budget) are rewritten compactly
// once the oldest runs are gone, and the bytes a run takes are measured
// again on what remains.
import type { Logger } from "../../config/index.js";
import { mib } from "../../nats/index.js";
import type { HistoryBackend } from "./history.js";

/** Part of the budget the rows are kept to: the rest absorbs what arrives between two checks. */
export const PRUNE_TO = 0.6;
/** Below this part of the budget nothing is counted or walked. */
const LOOK_FROM = 0.5;
/** Runs of the primary key walked per second of check interval, at most: a large cap is checked less often. */
const WALK_PER_SECOND = 100_000;

export class HistoryBudget {
  /** The largest size the tables had so far. */
  private highWater = 0;
  /** Bytes a run takes, measured at the high-water mark; 0 before the first measure. */
  private bytesPerRow = 0;
  private lastWalk = 0;

  constructor(
    private readonly queries: Pick<HistoryBackend, "size" | "rows" | "pruneToNewest" | "vacuum" | "compact">,
    /** Bytes the tables and their indexes may take. */
    readonly budget: number,
    private readonly logger: Logger,
  ) {}

  /** The runs the budget holds, at the bytes a run takes as last measured; Infinity before a measure. */
  get cap(): number {
    return this.bytesPerRow > 0 ? Math.floor((this.budget * PRUNE_TO) / this.bytesPerRow) : Infinity;
  }

  /** Measures the tables and deletes the oldest runs past the cap; says how many. */
  async check(now = Date.now()): Promise<number> {
    const size = await this.queries.size();
    if (size > this.highWater) {
      this.highWater = size;
      if (size >= this.budget * LOOK_FROM) {
        const rows = await this.queries.rows();
        if (rows > 0) this.bytesPerRow = size / rows;
      }
    }
    if (this.bytesPerRow === 0 || this.highWater < this.budget * LOOK_FROM) return 0;
    const cap = this.cap;
    const over = size > this.budget;
    // A walk of `cap` index entries; a large cap is walked less often (at once when the files are past the budget).
    if (!over && now - this.lastWalk < (cap / WALK_PER_SECOND) * 1000) return 0;
    this.lastWalk = now;
    const deleted = await this.queries.pruneToNewest(cap);
    if (over) return this.compact(deleted, size);
    if (deleted === 0) return 0;
    await this.queries.vacuum();
    this.logger.info(
      { deleted, kept: cap, bytes: size, budget: this.budget, bytesPerRun: Math.round(this.bytesPerRow) },
      `run history: ${deleted} oldest runs deleted to stay within its budget (${mib(this.budget)}, SKIFF_HISTORY_MAX_BYTES); it keeps the newest ${cap}`,
    );
    return deleted;
  }

  /** Files past the budget: rewritten compactly, and the bytes a run takes measured on what is left. */
  private async compact(deleted: number, size: number): Promise<number> {
    await this.queries.compact();
    const after = await this.queries.size();
    const rows = await this.queries.rows();
    if (rows > 0) this.bytesPerRow = after / rows;
    this.highWater = after;
    this.logger.warn(
      { deleted, bytes: size, after, budget: this.budget, bytesPerRun: Math.round(this.bytesPerRow) },
      `run history: its files passed its budget (${mib(this.budget)}, SKIFF_HISTORY_MAX_BYTES); ${deleted} oldest runs deleted and the tables rewritten compactly (${mib(after)})`,
    );
    return deleted;
  }
}
