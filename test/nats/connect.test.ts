// NATS authentication: skiff connects with SKIFF_NATS_CREDS, SKIFF_NATS_USER +
// SKIFF_NATS_PASSWORD or SKIFF_NATS_TOKEN; a server it starts itself requires
// generated credentials; a server that lets anyone in is used with a warning.
// Real nats-server processes throughout.
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, ErrorCode, nkeyAuthenticator, nkeys, StringCodec, type ConnectionOptions } from "nats";
import { pino, type Logger } from "pino";
import { afterEach, describe, expect, test } from "vitest";
import { ConfigError, loadConfig, natsAuth } from "../../services/config/config.js";
import { silentLogger } from "../../services/config/logger.js";
import {
  connectNats,
  NatsConnectError,
  NatsStartError,
  provision,
  STARTED_SERVER_SEED_FILE,
  type ConnectNatsOptions,
  type NatsHandle,
} from "../../services/nats/connect.js";
import { buckets } from "../../services/nats/layout.js";
import { makeOperatorAuth } from "../helpers/nats-creds.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { startTestSkiff } from "../helpers/skiff.js";

const sc = StringCodec();
const USER = "skiff";
const PASSWORD = "pw-4c1b9e0f7a2d-with spaces & $igns";
const TOKEN = "tok-8e51d03b2f6a47c9a1e0";
const ALL_AUTH_VARIABLES =
  /SKIFF_NATS_CREDS, SKIFF_NATS_USER and SKIFF_NATS_PASSWORD, SKIFF_NATS_TOKEN, or SKIFF_NATS_NKEY/;
const OPEN_SERVER_WARNING =
  /accepts connections without credentials: any process that can reach it, app replicas included, can read and write skiff's state.*SKIFF_NATS_CREDS/;

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "skiff-nats-auth-"));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

async function server(args: string[] = []): Promise<TestNats> {
  const s = await startNatsServer({ args });
  cleanups.push(() => s.stop());
  return s;
}

const userServer = () => server(["--user", USER, "--pass", PASSWORD]);

async function operatorServer(): Promise<{ nats: TestNats; credsFile: string }> {
  const dir = await tempDir();
  const { serverConfig, creds } = makeOperatorAuth();
  await writeFile(path.join(dir, "operator.conf"), serverConfig);
  const credsFile = path.join(dir, "skiff.creds");
  await writeFile(credsFile, creds, { mode: 0o600 });
  return { nats: await server(["-c", path.join(dir, "operator.conf")]), credsFile };
}

async function connectTracked(opts: ConnectNatsOptions): Promise<NatsHandle> {
  const handle = await connectNats(opts);
  cleanups.push(() => handle.close());
  return handle;
}

/** How a plain client (an app replica, say) fares against the server: the error code, or "connected". */
async function plainClient(url: string, extra: Partial<ConnectionOptions> = {}): Promise<string> {
  try {
    const nc = await connect({ servers: url, reconnect: false, ...extra });
    await nc.close();
    return "connected";
  } catch (err) {
    return (err as { code?: string }).code ?? String(err);
  }
}

/** A URL where nothing listens: a port the OS just handed out and that was closed again. */
async function closedUrl(): Promise<string> {
  const srv = net.createServer();
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  const { port } = srv.address() as net.AddressInfo;
  await new Promise((resolve) => srv.close(resolve));
  return `nats://127.0.0.1:${port}`;
}

function capturingLogger(): { logger: Logger; text: () => string; warnings: () => string[] } {
  const raw: string[] = [];
  const logger = pino({ level: "debug" }, { write: (s: string) => void raw.push(s) });
  return {
    logger,
    text: () => raw.join(""),
    warnings: () =>
      raw.map((s) => JSON.parse(s) as { level: number; msg: string }).flatMap((l) => (l.level === 40 ? [l.msg] : [])),
  };
}

/** Provisions through the handle and proves KV is readable and writable with its credentials. */
async function provisionAndUseKv(handle: NatsHandle): Promise<string> {
  await provision(handle.nc, silentLogger);
  const kv = await handle.nc.jetstream().views.kv(buckets.keys.name, { bindOnly: true });
  await kv.put("probe", sc.encode("written with credentials"));
  return sc.decode((await kv.get("probe"))!.value);
}

describe("nats auth - settings", () => {
  async function credsFile(): Promise<string> {
    const file = path.join(await tempDir(), "skiff.creds");
    await writeFile(file, makeOperatorAuth().creds);
    return file;
  }

  function refusal(env: Record<string, string>): ConfigError {
    try {
      loadConfig(env);
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      return err as ConfigError;
    }
    throw new Error(`loadConfig accepted ${Object.keys(env).join(", ")}`);
  }

  test("a user without a password, or a password without a user, is refused naming both variables", () => {
    const noPassword = refusal({ SKIFF_NATS_USER: USER });
    expect(noPassword.variable).toBe("SKIFF_NATS_PASSWORD");
    expect(noPassword.message).toBe(
      "SKIFF_NATS_PASSWORD: SKIFF_NATS_USER is set but SKIFF_NATS_PASSWORD is not: set both or neither",
    );

    const noUser = refusal({ SKIFF_NATS_PASSWORD: PASSWORD });
    expect(noUser.variable).toBe("SKIFF_NATS_USER");
    expect(noUser.message).toMatch(/^SKIFF_NATS_USER: SKIFF_NATS_PASSWORD is set but SKIFF_NATS_USER is not/);
    expect(noUser.message).not.toContain(PASSWORD);
  });

  test("two ways of authenticating at once are refused, naming the variables and never the secrets", async () => {
    const creds = await credsFile();
    const cases: [Record<string, string>, string][] = [
      [
        { SKIFF_NATS_USER: USER, SKIFF_NATS_PASSWORD: PASSWORD, SKIFF_NATS_TOKEN: TOKEN },
        "SKIFF_NATS_USER, SKIFF_NATS_PASSWORD, SKIFF_NATS_TOKEN",
      ],
      [{ SKIFF_NATS_CREDS: creds, SKIFF_NATS_TOKEN: TOKEN }, "SKIFF_NATS_CREDS, SKIFF_NATS_TOKEN"],
      [
        { SKIFF_NATS_CREDS: creds, SKIFF_NATS_USER: USER, SKIFF_NATS_PASSWORD: PASSWORD },
        "SKIFF_NATS_CREDS, SKIFF_NATS_USER, SKIFF_NATS_PASSWORD",
      ],
    ];
    for (const [env, variables] of cases) {
      const err = refusal(env);
      expect(err.variable).toBe(variables);
      expect(err.message).toMatch(/more than one way to authenticate to NATS; set only one/);
      expect(err.message).not.toContain(PASSWORD);
      expect(err.message).not.toContain(TOKEN);
    }
  });

  test("SKIFF_NATS_CREDS must name a readable credentials file; the message never shows its contents", async () => {
    const missing = refusal({ SKIFF_NATS_CREDS: path.join(await tempDir(), "nope.creds") });
    expect(missing.variable).toBe("SKIFF_NATS_CREDS");
    expect(missing.message).toMatch(/cannot read the NATS credentials file .*nope\.creds/);

    const notCreds = path.join(await tempDir(), "password.txt");
    await writeFile(notCreds, "hunter2-not-a-creds-file\n");
    const wrong = refusal({ SKIFF_NATS_CREDS: notCreds });
    expect(wrong.message).toMatch(/SKIFF_NATS_CREDS: .*password\.txt is not a NATS credentials file/);
    expect(wrong.message).not.toContain("hunter2");
  });

  test("each way alone is accepted; passwords and tokens are taken as they are", async () => {
    const creds = await credsFile();
    expect(natsAuth(loadConfig({ SKIFF_NATS_CREDS: creds }))).toEqual({ kind: "creds", file: creds });
    expect(natsAuth(loadConfig({ SKIFF_NATS_USER: USER, SKIFF_NATS_PASSWORD: ` ${PASSWORD} ` }))).toEqual({
      kind: "user",
      user: USER,
      password: ` ${PASSWORD} `,
    });
    expect(natsAuth(loadConfig({ SKIFF_NATS_TOKEN: TOKEN }))).toEqual({ kind: "token", token: TOKEN });
    expect(natsAuth(loadConfig({ SKIFF_NATS_TOKEN: "" }))).toBeUndefined();
  });
});

describe("nats auth - a server that requires credentials", () => {
  test("user and password: without them (or with a wrong one) nothing connects, so KV is out of reach", async () => {
    const nats = await userServer();
    const { logger, text, warnings } = capturingLogger();
    const handle = await connectTracked({
      url: nats.url,
      credentials: { natsUser: USER, natsPassword: PASSWORD },
      dataDir: await tempDir(),
      logger,
    });
    expect(handle.authRequired).toBe(true);
    expect(await provisionAndUseKv(handle)).toBe("written with credentials");
    expect(warnings()).toEqual([]);
    expect(text()).not.toContain(PASSWORD);

    expect(await plainClient(nats.url)).toBe(ErrorCode.AuthorizationViolation);
    expect(await plainClient(nats.url, { user: USER, pass: "guessed" })).toBe(ErrorCode.AuthorizationViolation);
    expect(await plainClient(nats.url, { user: USER, pass: PASSWORD })).toBe("connected");

    const anonymous = connectNats({ url: nats.url, dataDir: await tempDir(), logger: silentLogger });
    await expect(anonymous).rejects.toThrow(NatsConnectError);
    await expect(anonymous).rejects.toThrow(ALL_AUTH_VARIABLES);
    const wrong = connectNats({
      url: nats.url,
      credentials: { natsUser: USER, natsPassword: "guessed" },
      dataDir: await tempDir(),
      logger: silentLogger,
    });
    await expect(wrong).rejects.toThrow(/does not accept the credentials of SKIFF_NATS_USER and SKIFF_NATS_PASSWORD/);
  });

  test("token: skiff connects with SKIFF_NATS_TOKEN; without it, or with another, it is refused", async () => {
    const nats = await server(["--auth", TOKEN]);
    const { logger, text } = capturingLogger();
    const handle = await connectTracked({
      url: nats.url,
      credentials: { natsToken: TOKEN },
      dataDir: await tempDir(),
      logger,
    });
    expect(handle.authRequired).toBe(true);
    expect(await provisionAndUseKv(handle)).toBe("written with credentials");
    expect(text()).not.toContain(TOKEN);

    expect(await plainClient(nats.url)).toBe(ErrorCode.AuthorizationViolation);
    await expect(
      connectNats({
        url: nats.url,
        credentials: { natsToken: "tok-guessed" },
        dataDir: await tempDir(),
        logger: silentLogger,
      }),
    ).rejects.toThrow(/does not accept the credentials of SKIFF_NATS_TOKEN/);
  });

  test("a .creds file (operator, account and user JWTs): skiff connects with SKIFF_NATS_CREDS; without it nothing does", async () => {
    const { nats, credsFile } = await operatorServer();
    const handle = await connectTracked({
      url: nats.url,
      credentials: { natsCreds: credsFile },
      dataDir: await tempDir(),
      logger: silentLogger,
    });
    expect(handle.authRequired).toBe(true);
    expect(await provisionAndUseKv(handle)).toBe("written with credentials");

    expect(await plainClient(nats.url)).toBe(ErrorCode.AuthorizationViolation);
    const otherCreds = path.join(await tempDir(), "other.creds");
    await writeFile(otherCreds, makeOperatorAuth().creds);
    await expect(
      connectNats({
        url: nats.url,
        credentials: { natsCreds: otherCreds },
        dataDir: await tempDir(),
        logger: silentLogger,
      }),
    ).rejects.toThrow(/does not accept the credentials of SKIFF_NATS_CREDS \(.*other\.creds\)/);
  });

  test("at the probe URL: used with credentials; without them skiff starts a server of its own and never asks it", async () => {
    const nats = await userServer();
    const handle = await connectTracked({
      probeUrl: nats.url,
      credentials: { natsUser: USER, natsPassword: PASSWORD },
      dataDir: await tempDir(),
      logger: silentLogger,
    });
    expect({ url: handle.url, embedded: handle.embedded, authRequired: handle.authRequired }).toEqual({
      url: nats.url,
      embedded: false,
      authRequired: true,
    });

    const dataDir = await tempDir();
    const own = await connectTracked({ probeUrl: nats.url, dataDir, logger: silentLogger });
    expect({ embedded: own.embedded, authRequired: own.authRequired }).toEqual({ embedded: true, authRequired: true });
    expect(own.url).not.toBe(nats.url);
    await stat(path.join(dataDir, "nats", "skiff.nk"));
  });

  test("a whole skiff given SKIFF_NATS_USER and SKIFF_NATS_PASSWORD starts, provisions and is ready", async () => {
    const nats = await userServer();
    const { logger, text, warnings } = capturingLogger();
    const t = await startTestSkiff({
      nats,
      env: { SKIFF_NATS_USER: USER, SKIFF_NATS_PASSWORD: PASSWORD },
      logger,
    });
    cleanups.push(() => t.close());
    const readyz = await fetch(`${t.url}/readyz`);
    expect({ status: readyz.status, body: await readyz.json() }).toEqual({
      status: 200,
      body: { status: "ready" },
    });
    expect(warnings().filter((w) => OPEN_SERVER_WARNING.test(w))).toEqual([]);
    expect(text()).not.toContain(PASSWORD);
  });
});

describe("nats auth - the server skiff starts itself", () => {
  test("admits only a generated nkey, whose seed is kept 0600 in the data folder and reused on restart", async () => {
    const dataDir = await tempDir();
    const natsDir = path.join(dataDir, "nats");
    const seedFile = path.join(natsDir, STARTED_SERVER_SEED_FILE);
    const { logger, text, warnings } = capturingLogger();
    const first = await connectTracked({ probeUrl: await closedUrl(), dataDir, logger });
    expect({ embedded: first.embedded, authRequired: first.authRequired }).toEqual({
      embedded: true,
      authRequired: true,
    });
    expect(first.nc.info?.host).toBe("127.0.0.1");

    expect((await stat(seedFile)).mode & 0o777).toBe(0o600);
    expect((await stat(natsDir)).mode & 0o777).toBe(0o700);
    const seed = (await readFile(seedFile, "utf8")).trim();
    expect(seed).toMatch(/^SU[A-Z2-7]{56}$/);
    const publicKey = nkeys.fromSeed(sc.encode(seed)).getPublicKey();
    const serverConfig = await readFile(path.join(natsDir, "nats-server.conf"), "utf8");
    expect(serverConfig).toContain(publicKey);
    expect(serverConfig).not.toContain(seed);
    expect(text()).not.toContain(seed);
    expect(warnings()).toEqual([]);

    const withSeed = (s: string) => ({ authenticator: nkeyAuthenticator(sc.encode(s)) });
    expect(await plainClient(first.url)).toBe(ErrorCode.AuthorizationViolation);
    expect(await plainClient(first.url, withSeed(new TextDecoder().decode(nkeys.createUser().getSeed())))).toBe(
      ErrorCode.AuthorizationViolation,
    );
    expect(await plainClient(first.url, withSeed(seed))).toBe("connected");
    expect(await provisionAndUseKv(first)).toBe("written with credentials");
    await first.close();

    const second = await connectTracked({ probeUrl: await closedUrl(), dataDir, logger: silentLogger });
    expect(second.serverPid).not.toBe(first.serverPid);
    expect((await readFile(seedFile, "utf8")).trim()).toBe(seed);
    expect(await plainClient(second.url)).toBe(ErrorCode.AuthorizationViolation);
    expect(await plainClient(second.url, withSeed(seed))).toBe("connected");
    const kv = await second.nc.jetstream().views.kv(buckets.keys.name, { bindOnly: true });
    expect(sc.decode((await kv.get("probe"))!.value)).toBe("written with credentials");
  });

  test("a seed file left readable by others is made the owner's only again, with a warning", async () => {
    const dataDir = await tempDir();
    const seedFile = path.join(dataDir, "nats", STARTED_SERVER_SEED_FILE);
    await (await connectTracked({ probeUrl: await closedUrl(), dataDir, logger: silentLogger })).close();
    await chmod(seedFile, 0o644);

    const { logger, warnings } = capturingLogger();
    await connectTracked({ probeUrl: await closedUrl(), dataDir, logger });
    expect((await stat(seedFile)).mode & 0o777).toBe(0o600);
    expect(warnings()).toEqual([expect.stringMatching(/seed file was readable by others/)]);
  });

  test("a damaged seed file stops skiff with a message naming it", async () => {
    const dataDir = await tempDir();
    const seedFile = path.join(dataDir, "nats", STARTED_SERVER_SEED_FILE);
    await (await connectTracked({ probeUrl: await closedUrl(), dataDir, logger: silentLogger })).close();
    await writeFile(seedFile, "SUNOTASEED\n");

    const attempt = connectNats({ probeUrl: await closedUrl(), dataDir, logger: silentLogger });
    await expect(attempt).rejects.toThrow(NatsStartError);
    await expect(attempt).rejects.toThrow(`${seedFile} does not hold the nkey seed of a NATS user`);
  });
});

describe("nats auth - a server that lets anyone in", () => {
  test("is used, with a warning at start that names the settings and the risk", async () => {
    const nats = await server();
    const { logger, warnings } = capturingLogger();
    const handle = await connectTracked({ url: nats.url, dataDir: await tempDir(), logger });
    expect(handle.authRequired).toBe(false);
    expect(warnings()).toEqual([expect.stringMatching(OPEN_SERVER_WARNING)]);
  });

  test("and /readyz of a skiff using it says nats_auth: false", async () => {
    const t = await startTestSkiff();
    cleanups.push(() => t.close());
    const readyz = await fetch(`${t.url}/readyz`);
    expect(await readyz.json()).toEqual({ status: "ready", nats_auth: false });
  });
});
