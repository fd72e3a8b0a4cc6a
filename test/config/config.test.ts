import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { nkeys } from "nats";
import { describe, expect, it } from "vitest";
import {
  ConfigError,
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_MAX_BUNDLE_BYTES,
  DEFAULT_MAX_PROJECT_UNPACKED_BYTES,
  DEFAULT_PORT,
  loadConfig,
  natsAuth,
  ROLES,
  settingsTable,
} from "../../services/config/config.js";

describe("config", () => {
  it("defaults apply when no SKIFF_* variable is set", () => {
    const c = loadConfig({});
    expect(c).toEqual({
      host: "127.0.0.1",
      port: DEFAULT_PORT,
      dataDir: ".data",
      databaseUrl: undefined,
      natsUrl: undefined,
      natsCreds: undefined,
      natsUser: undefined,
      natsPassword: undefined,
      natsToken: undefined,
      natsReplicas: 1,
      maxBodyBytes: DEFAULT_MAX_BODY_BYTES,
      maxBundleBytes: DEFAULT_MAX_BUNDLE_BYTES,
      maxUploads: 8,
      maxProjectUploads: 2,
      maxProjectUnpackedBytes: DEFAULT_MAX_PROJECT_UNPACKED_BYTES,
      firstBytesTimeoutMs: 10_000,
      headersTimeoutMs: 20_000,
      keepAliveTimeoutMs: 5_000,
      http2IdleTimeoutMs: 60_000,
      maxConnections: undefined,
      maxConnectionsPerAddress: 256,
      logLevel: "info",
      roles: [...ROLES],
      workers: 1,
      shutdownTimeoutMs: 15_000,
      stopDeadlineMs: 25_000,
      signingKey: undefined,
      adminToken: undefined,
      webhookTimeoutMs: 10_000,
      webhookAllowedCidrs: undefined,
      secretsKey: undefined,
      resultTtlSeconds: 86_400,
      maxQueuedRuns: 10_000,
      runAckWaitMs: 30_000,
      finalRecordKeepMs: 60_000,
      sandbox: "on",
      replicaMemoryMb: 2048,
      replicaPids: 512,
      replicaFileMb: 100,
      replicaTmpMb: 100,
      replicaCpuSeconds: 0,
      projectMaxReplicas: 20,
      projectMemoryMb: 16_384,
      replicaLogLinesPerSecond: 200,
      maxResultBytes: 32 * 1024 * 1024,
      maxAsyncResultBytes: 64 * 1024 * 1024,
      maxBundleFiles: 20_000,
      replicaOpenFiles: 4096,
      maxBuildBytes: 2 * 1024 * 1024 * 1024,
      maxBuildFiles: 200_000,
      maxConcurrentBuilds: 2,
      pipIndexUrl: undefined,
      pipExtraIndexUrls: [],
      maxAppsPerProject: 100,
      maxSecretsPerProject: 100,
      projectStorageBytes: 1024 * 1024 * 1024,
      replicaNetwork: "auto",
      replicaDirect: "on",
      replicaDeniedCidrs: ["169.254.0.0/16"],
      websocketIdleTimeoutMs: 300_000,
      websocketMaxMessageBytes: 1024 * 1024,
      websocketMaxConnectionsPerApp: 1000,
      storageShare: 50,
      eventsMaxBytes: undefined,
      webhooksMaxBytes: undefined,
      runQueueMaxBytes: undefined,
      logsMaxBytes: undefined,
      resultsMaxBytes: undefined,
      bundlesMaxBytes: undefined,
      kvMaxBytes: undefined,
      historyMaxBytes: undefined,
    });
  });

  it("store budgets are sizes in bytes, with units of 1024 as nats-server reads them; a bad one names its variable", () => {
    const c = loadConfig({
      SKIFF_EVENTS_MAX_BYTES: "100MB",
      SKIFF_WEBHOOKS_MAX_BYTES: "20 MiB",
      SKIFF_RUN_QUEUE_MAX_BYTES: "1.5G",
      SKIFF_LOGS_MAX_BYTES: "2097152",
      SKIFF_RESULTS_MAX_BYTES: "1TB",
      SKIFF_BUNDLES_MAX_BYTES: "64m",
      SKIFF_KV_MAX_BYTES: "8MB",
      SKIFF_HISTORY_MAX_BYTES: "3GiB",
      SKIFF_STORAGE_SHARE: "25",
    });
    expect(c).toMatchObject({
      eventsMaxBytes: 100 * 2 ** 20,
      webhooksMaxBytes: 20 * 2 ** 20,
      runQueueMaxBytes: 1.5 * 2 ** 30,
      logsMaxBytes: 2 * 2 ** 20,
      resultsMaxBytes: 2 ** 40,
      bundlesMaxBytes: 64 * 2 ** 20,
      kvMaxBytes: 8 * 2 ** 20,
      historyMaxBytes: 3 * 2 ** 30,
      storageShare: 25,
    });
    const bad: [Record<string, string>, RegExp][] = [
      [{ SKIFF_EVENTS_MAX_BYTES: "lots" }, /^SKIFF_EVENTS_MAX_BYTES: expected a size in bytes such as .*got "lots"/],
      [{ SKIFF_KV_MAX_BYTES: "-5MB" }, /^SKIFF_KV_MAX_BYTES: expected a size in bytes/],
      [{ SKIFF_HISTORY_MAX_BYTES: "10PB" }, /^SKIFF_HISTORY_MAX_BYTES: expected a size in bytes/],
      [
        { SKIFF_RUN_QUEUE_MAX_BYTES: "1000" },
        /^SKIFF_RUN_QUEUE_MAX_BYTES: must be at least 1048576 bytes \(1 MiB\), got 1000/,
      ],
      [{ SKIFF_LOGS_MAX_BYTES: "99999999999999999999" }, /^SKIFF_LOGS_MAX_BYTES: is too large/],
      [{ SKIFF_STORAGE_SHARE: "95" }, /^SKIFF_STORAGE_SHARE: must be between 1 and 90, got 95/],
      [{ SKIFF_STORAGE_SHARE: "0" }, /^SKIFF_STORAGE_SHARE: must be between 1 and 90, got 0/],
    ];
    for (const [env, message] of bad) expect(() => loadConfig(env), JSON.stringify(env)).toThrow(message);
  });

  it("SKIFF_* variables override the defaults", () => {
    const c = loadConfig({
      SKIFF_PORT: "0",
      SKIFF_NATS_URL: "nats://10.0.0.1:4222",
      SKIFF_ROLES: "webhook, runner",
      SKIFF_MAX_BODY_BYTES: "1024",
    });
    expect(c.port).toBe(0);
    expect(c.natsUrl).toBe("nats://10.0.0.1:4222");
    expect(c.roles).toEqual(["webhook", "runner"]);
    expect(c.maxBodyBytes).toBe(1024);
  });

  it.each([
    ["SKIFF_PORT", "abc", /SKIFF_PORT: expected a whole number/],
    ["SKIFF_PORT", "70000", /SKIFF_PORT: must be between 0 and 65535/],
    ["SKIFF_MAX_BODY_BYTES", "0", /SKIFF_MAX_BODY_BYTES/],
    ["SKIFF_MAX_BUNDLE_BYTES", "100", /SKIFF_MAX_BUNDLE_BYTES: must be between 1024/],
    ["SKIFF_LOG_LEVEL", "loud", /SKIFF_LOG_LEVEL: must be one of/],
    ["SKIFF_ROLES", "invocation,cook", /SKIFF_ROLES: unknown role "cook"/],
    ["SKIFF_ROLES", " , ", /SKIFF_ROLES: name at least one role/],
    ["SKIFF_DATA_DIR", "  ", /SKIFF_DATA_DIR: must not be empty/],
    ["SKIFF_DATABASE_URL", "mysql://db/skiff", /SKIFF_DATABASE_URL: expected a postgres:\/\/ or postgresql:\/\/ URL/],
    ["SKIFF_DATABASE_URL", "not a url", /SKIFF_DATABASE_URL: expected a URL/],
    ["SKIFF_WEBHOOK_ALLOWED_CIDRS", "10.0.0.0/8,banana", /SKIFF_WEBHOOK_ALLOWED_CIDRS: not a CIDR range: "banana"/],
    ["SKIFF_REPLICA_DENIED_CIDRS", "10.0.0.0/8,banana", /SKIFF_REPLICA_DENIED_CIDRS: not a CIDR range: "banana"/],
    ["SKIFF_REPLICA_DENIED_CIDRS", "fd00::/8", /SKIFF_REPLICA_DENIED_CIDRS: "fd00::\/8": IPv4 only/],
    ["SKIFF_BWRAP", "bwrap", /SKIFF_BWRAP: must be an absolute path/],
    ["SKIFF_SECRETS_KEY", "c2hvcnQ=", /SKIFF_SECRETS_KEY: must decode to 32 bytes/],
    ["SKIFF_WEBHOOK_TIMEOUT_MS", "5", /SKIFF_WEBHOOK_TIMEOUT_MS: must be between/],
    ["SKIFF_PROJECT_MAX_REPLICAS", "0", /SKIFF_PROJECT_MAX_REPLICAS: must be between 1/],
    ["SKIFF_PROJECT_MEMORY_MB", "1024", /SKIFF_PROJECT_MEMORY_MB: must be at least SKIFF_REPLICA_MEMORY_MB \(2048\)/],
    ["SKIFF_REPLICA_LOG_LINES_PER_SECOND", "0", /SKIFF_REPLICA_LOG_LINES_PER_SECOND: must be between 1/],
    ["SKIFF_MAX_RESULT_BYTES", "10", /SKIFF_MAX_RESULT_BYTES: must be between 1024/],
    ["SKIFF_MAX_ASYNC_RESULT_BYTES", "x", /SKIFF_MAX_ASYNC_RESULT_BYTES: expected a whole number/],
    ["SKIFF_PIP_INDEX_URL", "not a url", /SKIFF_PIP_INDEX_URL: expected a URL such as https:/],
    ["SKIFF_PIP_INDEX_URL", "file:///opt/pypi/simple", /SKIFF_PIP_INDEX_URL: expected an http:\/\/ or https:\/\/ URL/],
    [
      "SKIFF_PIP_EXTRA_INDEX_URL",
      "https://a.example/simple ftp://b.example/",
      /SKIFF_PIP_EXTRA_INDEX_URL: expected an http:\/\/ or https:\/\/ URL/,
    ],
    [
      "SKIFF_SIGNING_KEY",
      "not a key",
      /SKIFF_SIGNING_KEY: expected an Ed25519 private key as a JWK \(JSON\) or PKCS#8 PEM/,
    ],
    ["SKIFF_SIGNING_KEY", '{"kty":"oct","k":"c2VjcmV0"}', /SKIFF_SIGNING_KEY: expected an Ed25519/],
    ["SKIFF_ADMIN_TOKEN", "too-short", /SKIFF_ADMIN_TOKEN: must be at least 32 printable ASCII characters/],
    [
      "SKIFF_ADMIN_TOKEN",
      "has a space in the middle of it, which headers mangle",
      /SKIFF_ADMIN_TOKEN: must be at least 32/,
    ],
  ])("%s=%j is refused with a message naming the variable", (variable, value, message) => {
    let error: unknown;
    try {
      loadConfig({ [variable]: value });
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).variable).toBe(variable);
    expect((error as Error).message).toMatch(message);
  });

  it("SKIFF_WORKERS is 1 to 256, and more than 1 only with the sandbox on", () => {
    expect(loadConfig({ SKIFF_WORKERS: "4" }).workers).toBe(4);
    expect(() => loadConfig({ SKIFF_WORKERS: "0" })).toThrow(/SKIFF_WORKERS.*between 1 and 256/);
    expect(() => loadConfig({ SKIFF_WORKERS: "two" })).toThrow(/SKIFF_WORKERS.*whole number/);
    expect(() => loadConfig({ SKIFF_WORKERS: "2", SKIFF_SANDBOX: "off" })).toThrow(
      /SKIFF_WORKERS.*SKIFF_SANDBOX=off.*share this machine's ports/,
    );
    expect(loadConfig({ SKIFF_WORKERS: "1", SKIFF_SANDBOX: "off" }).workers).toBe(1);
  });

  it("SKIFF_NATS_NKEY names a file holding a user's nkey seed, alone among the ways to authenticate", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "skiff-nkey-"));
    try {
      const seedFile = path.join(dir, "user.nk");
      await writeFile(seedFile, `${new TextDecoder().decode(nkeys.createUser().getSeed())}\n`);
      expect(natsAuth(loadConfig({ SKIFF_NATS_NKEY: seedFile }))).toEqual({ kind: "nkey", file: seedFile });
      const accountSeed = path.join(dir, "account.nk");
      await writeFile(accountSeed, new TextDecoder().decode(nkeys.createAccount().getSeed()));
      expect(() => loadConfig({ SKIFF_NATS_NKEY: accountSeed })).toThrow(
        /SKIFF_NATS_NKEY.*not hold the nkey seed of a NATS user/,
      );
      expect(() => loadConfig({ SKIFF_NATS_NKEY: path.join(dir, "missing") })).toThrow(/SKIFF_NATS_NKEY.*cannot read/);
      expect(() => loadConfig({ SKIFF_NATS_NKEY: seedFile, SKIFF_NATS_TOKEN: "t" })).toThrow(
        /SKIFF_NATS_TOKEN, SKIFF_NATS_NKEY.*only one/,
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("SKIFF_PIP_INDEX_URL is one index; SKIFF_PIP_EXTRA_INDEX_URL several, separated by spaces", () => {
    const config = loadConfig({
      SKIFF_PIP_INDEX_URL: "https://pypi.example.internal/simple",
      SKIFF_PIP_EXTRA_INDEX_URL: " http://a.example/simple  https://b.example/simple ",
    });
    expect(config.pipIndexUrl).toBe("https://pypi.example.internal/simple");
    expect(config.pipExtraIndexUrls).toEqual(["http://a.example/simple", "https://b.example/simple"]);
  });

  it("SKIFF_SIGNING_KEY takes an Ed25519 key as a JWK or as PKCS#8 PEM, newlines written \\n or not", async () => {
    const { newEd25519Key } = await import("../../services/auth/tokens.js");
    const key = newEd25519Key();
    const pem = String(key.export({ format: "pem", type: "pkcs8" }));
    for (const raw of [JSON.stringify(key.export({ format: "jwk" })), pem, pem.replace(/\n/g, "\\n")]) {
      expect(loadConfig({ SKIFF_SIGNING_KEY: raw }).signingKey).toBe(raw.trim());
    }
  });

  it("the README's configuration table is the one the code makes", async () => {
    const { readFile } = await import("node:fs/promises");
    const readme = await readFile(new URL("../../README.md", import.meta.url), "utf8");
    expect(readme).toContain(settingsTable());
  });
});
