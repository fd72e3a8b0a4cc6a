import { defineConfig } from "vitest/config";

/**
 * The fault suite (`npm run test:faults`): real skiff processes on a NATS
 * cluster or server of their own, faults injected under load, counts printed.
 * Minutes, not seconds: not part of `npm test`. One file at a time, each
 * scenario after the other, as they load the machine.
 */
export default defineConfig({
  test: {
    include: ["test/faults/**/*.test.ts"],
    testTimeout: 600_000,
    hookTimeout: 300_000,
    pool: "forks",
    globalSetup: ["test/helpers/global-setup.ts"],
    fileParallelism: false,
    sequence: { concurrent: false },
  },
});
