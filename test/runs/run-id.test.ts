// Run ids (runs/run-id.ts): UUIDv7 whose string order is the order they were
// made in, within a millisecond too, and unique.
import { describe, expect, it } from "vitest";
import { newRunId } from "../../services/runs/run-id.js";
import { timeOfId } from "../../services/runs/index.js";

const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe("run ids", () => {
  it("are UUIDv7 of the time they were made, each greater than the one before, many in one millisecond", () => {
    const before = Date.now();
    const ids = Array.from({ length: 50_000 }, () => newRunId());
    const after = Date.now();
    for (let i = 0; i < ids.length; i++) {
      expect(ids[i]).toMatch(UUID_V7);
      if (i > 0 && !(ids[i] > ids[i - 1])) expect.fail(`id ${i} ${ids[i]} is not after ${ids[i - 1]}`);
    }
    expect(new Set(ids).size).toBe(ids.length);
    expect(timeOfId(ids[0])).toBeGreaterThanOrEqual(before);
    // A counter that runs over borrows the next millisecond, so the last may be a little ahead.
    expect(timeOfId(ids.at(-1)!)).toBeLessThanOrEqual(after + 1);
  });

  it("in one millisecond: the counter counts up, and its random tail still differs", () => {
    const now = Date.now() + 60_000;
    const ids = Array.from({ length: 1_000 }, () => newRunId(now));
    expect(ids.every((id) => timeOfId(id) === now)).toBe(true);
    expect([...ids].sort()).toEqual(ids);
    expect(new Set(ids.map((id) => id.slice(-10))).size).toBeGreaterThan(990);
  });
});
