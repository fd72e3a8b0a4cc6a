import { configDefaults, defineConfig } from "vitest/config";

/**
 * The unit tests: modules on their own, in the test process (a listener on
 * 127.0.0.1 at most), quick. No nats-server, no child process (buf, python3,
 * tsx, skiff, app replicas), no browser, no waiting on deadlines of seconds.
 * Every other test file is an integration test, new ones included.
 */
const UNIT = [
  "test/apps/app-config.test.ts",
  "test/apps/bundle.links.test.ts",
  "test/apps/bundle.test.ts",
  "test/apps/cerebrium-config.test.ts",
  "test/architecture.test.ts",
  "test/auth/authenticator.test.ts",
  "test/config/config.test.ts",
  "test/helpers/stall-watch.test.ts",
  "test/management/stats.test.ts",
  "test/runner/deployment-cache.test.ts",
  "test/runner/replica-set.test.ts",
  "test/runner/slot-queue.test.ts",
  "test/runs/event-bytes.test.ts",
  "test/secrets/names.test.ts",
  "test/server/rest/transcoder.property.test.ts",
  "test/server/rest/transcoder.test.ts",
  "test/server/static-files.test.ts",
  "test/server/websocket-frames.test.ts",
  "test/webhooks/address-guard.test.ts",
  "test/webhooks/endpoint.test.ts",
];

/**
 * Fuzzing (fast-check): FUZZ_RUNS cases per property, 500 by default (as in
 * `npm test`), 10,000 with `npm run test:fuzz`. Each test sets its own time
 * limit from FUZZ_RUNS.
 */
const FUZZ = ["test/fuzz/**/*.test.ts"];

/**
 * Integration files that run in a process of their own: they make network
 * namespaces and veth pairs on the host, which failed now and then
 * ("setting the network namespace … failed") in a worker that had run other
 * files before.
 */
const ISOLATED = ["test/runner/sandbox-network.test.ts"];

/**
 * Deadlines of a test and of its hooks: above every wait inside a test (those
 * wait on events, up to a minute on a loaded machine), so that a wait that
 * fails says what it waited for.
 */
const timeouts = { testTimeout: 120_000, hookTimeout: 120_000 };

export default defineConfig({
  test: {
    // The default reporter, and one that ends a run in which nothing has started or ended for 10 minutes, saying what was in
    // flight (SKIFF_TEST_STALL_MINUTES): a hang where no deadline reaches would otherwise sit until CI's limit, silent.
    reporters: ["default", "./test/helpers/stall-watch.ts"],
    // Files at once. Most integration files spend their time waiting on processes (nats-server, replicas,
    // skiff itself); vitest's default (one less than the cores) runs them one after another on 2 cores.
    maxWorkers: 4,
    // `vitest run` runs them all; `--project unit`, `--project integration` (with `integration-isolated`) or `--project fuzz` one of them.
    projects: [
      { test: { name: "unit", include: UNIT, ...timeouts, pool: "threads" } },
      {
        test: {
          name: "integration",
          include: ["test/**/*.test.ts"],
          // The fault suite runs alone: `npm run test:faults` (vitest.faults.config.ts).
          exclude: [...configDefaults.exclude, ...UNIT, ...FUZZ, ...ISOLATED, "test/faults/**"],
          ...timeouts,
          pool: "forks",
          // A worker process runs file after file without loading skiff's modules again for each: loading them
          // cost about a second of CPU a file. Files keep no state in modules: each starts and stops what it uses
          // (nats-server, skiff, replicas) and gives back what it changes (process.env).
          isolate: false,
          // The server's and the CLI's bundles, made once before the files that start them.
          globalSetup: ["test/helpers/global-setup.ts"],
        },
      },
      {
        test: {
          name: "integration-isolated",
          include: ISOLATED,
          ...timeouts,
          pool: "forks",
          globalSetup: ["test/helpers/global-setup.ts"],
        },
      },
      { test: { name: "fuzz", include: FUZZ, ...timeouts, pool: "forks" } },
    ],
  },
});
