// SKIFF_WORKERS shares the per-project quotas of the machine among its
// workers: each worker's configuration holds its share, the shares sum to
// the setting, and a setting that would leave a worker without room for one
// replica stops skiff before it starts.
import { describe, expect, it } from "vitest";
import { loadConfig, workerQuotas } from "../../services/config/index.js";

const worker = (env: Record<string, string>, n: number) => loadConfig({ SKIFF_WORKERS: "3", ...env }, { worker: n });

describe("per-project quotas under SKIFF_WORKERS", () => {
  it("each worker holds its share; the shares sum to the setting and differ by one replica at most", () => {
    const env = { SKIFF_PROJECT_MAX_REPLICAS: "20", SKIFF_PROJECT_MEMORY_MB: "17000", SKIFF_REPLICA_MEMORY_MB: "2048" };
    const workers = [1, 2, 3].map((n) => worker(env, n));
    expect(workers.map((c) => c.projectMaxReplicas)).toEqual([7, 7, 6]);
    // 17000 MiB is 8 replicas of 2048 and 616 MiB over: 3 + 3 + 2 replicas, worker 1 keeping what is over.
    expect(workers.map((c) => c.projectMemoryMb)).toEqual([3 * 2048 + 616, 3 * 2048, 2 * 2048]);
    expect(workers.reduce((sum, c) => sum + c.projectMemoryMb, 0)).toBe(17000);
    // The supervisor and a lone process keep the setting.
    expect(loadConfig({ SKIFF_WORKERS: "3", ...env }).projectMaxReplicas).toBe(20);
    expect(loadConfig(env).projectMemoryMb).toBe(17000);
  });

  it("for every quota and number of workers, the shares sum to the quota and none is less than another by more than 1", () => {
    for (let workers = 1; workers <= 12; workers++)
      for (let quota = workers; quota <= 50; quota++) {
        const shares = Array.from(
          { length: workers },
          (_, i) =>
            workerQuotas(
              { workers, projectMaxReplicas: quota, projectMemoryMb: 256 * quota, replicaMemoryMb: 256 },
              i + 1,
            ).projectMaxReplicas,
        );
        expect(shares.reduce((a, b) => a + b, 0)).toBe(quota);
        expect(Math.max(...shares) - Math.min(...shares)).toBeLessThanOrEqual(1);
        expect(Math.min(...shares)).toBeGreaterThanOrEqual(1);
      }
  });

  it("a quota that would leave a worker without room for one replica is refused, naming the setting", () => {
    expect(() => loadConfig({ SKIFF_WORKERS: "3", SKIFF_PROJECT_MAX_REPLICAS: "2" })).toThrow(
      /SKIFF_PROJECT_MAX_REPLICAS: must be at least SKIFF_WORKERS \(3\), got 2/,
    );
    expect(() =>
      loadConfig({ SKIFF_WORKERS: "3", SKIFF_PROJECT_MEMORY_MB: "6000", SKIFF_REPLICA_MEMORY_MB: "2048" }),
    ).toThrow(
      /SKIFF_PROJECT_MEMORY_MB: must be at least SKIFF_WORKERS \(3\) × SKIFF_REPLICA_MEMORY_MB \(2048\) = 6144/,
    );
    expect(worker({ SKIFF_PROJECT_MAX_REPLICAS: "3", SKIFF_PROJECT_MEMORY_MB: "6144" }, 3)).toMatchObject({
      projectMaxReplicas: 1,
      projectMemoryMb: 2048,
    });
  });
});
