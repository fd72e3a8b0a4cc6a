import { configDefaults, defineConfig } from "vitest/config";

/**
 * The unit tests: modules on their own, in the test process (a listener on
 * 127.0.0.1 at most), quick. No nats-server, no child process (buf, python3,
 * tsx, skiff, app replicas), no browser, no waiting on deadlines of seconds.
 * Every other test file is an integration test, new ones included.
 */
const UNIT = [
  "test/app-config.test.ts",
  "test/architecture.test.ts",
  "test/auth-cache.test.ts",
  "test/bundle-links.test.ts",
  "test/bundle.test.ts",
  "test/config.test.ts",
  "test/dashboard-stats.test.ts",
  "test/deployment-cache.test.ts",
  "test/static-files.test.ts",
  "test/transcoder-property.test.ts",
  "test/transcoder.test.ts",
  "test/webhook-address-guard.test.ts",
  "test/webhook-delivery-endpoint.test.ts",
];

const timeouts = { testTimeout: 30_000, hookTimeout: 60_000 };

export default defineConfig({
  test: {
    // `vitest run` runs both; `--project unit` or `--project integration` one of them.
    projects: [
      { test: { name: "unit", include: UNIT, ...timeouts, pool: "threads" } },
      {
        test: {
          name: "integration",
          include: ["test/**/*.test.ts"],
          exclude: [...configDefaults.exclude, ...UNIT],
          ...timeouts,
          pool: "forks",
        },
      },
    ],
  },
});
