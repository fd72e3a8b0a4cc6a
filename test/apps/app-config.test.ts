import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  AppConfigError,
  DEFAULT_COOLDOWN,
  DEFAULT_HEALTHCHECK,
  DEFAULT_MAX_REPLICAS,
  DEFAULT_MIN_REPLICAS,
  DEFAULT_REPLICA_CONCURRENCY,
  DEFAULT_RESPONSE_GRACE_PERIOD,
  loadAppConfig,
  parseAppConfig,
  type AppConfig,
} from "../../services/apps/app-config.js";

const CORTEX = `[app]\nname = "hello"\n\n[runtime]\nkind = "cortex"\nlanguage = "python"\nentry = "main.py"\n`;
const CUSTOM = `[app]\nname = "web"\n\n[runtime]\nkind = "custom"\ncommand = ["node", "server.js"]\n`;

function issues(text: string): string[] {
  try {
    parseAppConfig(text);
  } catch (err) {
    expect(err).toBeInstanceOf(AppConfigError);
    return (err as AppConfigError).message.split("\n");
  }
  throw new Error("the config was accepted");
}

describe("app config (skiff.toml)", () => {
  it("a minimal cortex app gets every default", () => {
    expect(parseAppConfig(CORTEX)).toEqual<AppConfig>({
      app: { name: "hello" },
      runtime: { kind: "cortex", language: "python", entry: "main.py" },
      env: {},
      scaling: {
        minReplicas: DEFAULT_MIN_REPLICAS,
        maxReplicas: DEFAULT_MAX_REPLICAS,
        replicaConcurrency: DEFAULT_REPLICA_CONCURRENCY,
        cooldown: DEFAULT_COOLDOWN,
        responseGracePeriod: DEFAULT_RESPONSE_GRACE_PERIOD,
      },
    });
    expect([
      DEFAULT_MIN_REPLICAS,
      DEFAULT_MAX_REPLICAS,
      DEFAULT_REPLICA_CONCURRENCY,
      DEFAULT_COOLDOWN,
      DEFAULT_RESPONSE_GRACE_PERIOD,
    ]).toEqual([0, 2, 1, 30, 900]);
  });

  it("a custom app with every key", () => {
    const text = `${CUSTOM}healthcheck = "/healthz"\nreadycheck = "/ready"\nport = 9000\n\n[env]\nGREETING = "hi"\n_X1 = ""\n\n[scaling]\nmin_replicas = 1\nmax_replicas = 4\nreplica_concurrency = 8\ncooldown = 5\nresponse_grace_period = 43200\n`;
    expect(parseAppConfig(text)).toEqual<AppConfig>({
      app: { name: "web" },
      runtime: {
        kind: "custom",
        command: ["node", "server.js"],
        healthcheck: "/healthz",
        readycheck: "/ready",
        port: 9000,
      },
      env: { GREETING: "hi", _X1: "" },
      scaling: { minReplicas: 1, maxReplicas: 4, replicaConcurrency: 8, cooldown: 5, responseGracePeriod: 43200 },
    });
    expect(parseAppConfig(CUSTOM).runtime).toEqual({
      kind: "custom",
      command: ["node", "server.js"],
      healthcheck: DEFAULT_HEALTHCHECK,
    });
  });

  it("[build] secrets: the names, once each and sorted; an empty list is none", () => {
    expect(parseAppConfig(`${CORTEX}\n[build]\nsecrets = ["HF_TOKEN", "A", "HF_TOKEN"]\n`).buildSecrets).toEqual([
      "A",
      "HF_TOKEN",
    ]);
    expect(parseAppConfig(`${CORTEX}\n[build]\nsecrets = []\n`).buildSecrets).toBeUndefined();
    expect(parseAppConfig(CORTEX).buildSecrets).toBeUndefined();
  });

  it.each([
    [
      "node entry in a folder",
      CORTEX.replace('"python"', '"node"').replace("main.py", "src/index.mjs"),
      (c: AppConfig) => c.runtime.kind === "cortex" && c.runtime.entry === "src/index.mjs",
    ],
    [
      "name of 63 characters",
      CORTEX.replace('"hello"', `"a${"b".repeat(62)}"`),
      (c: AppConfig) => c.app.name.length === 63,
    ],
    [
      "min equal to max",
      `${CORTEX}[scaling]\nmin_replicas = 2\nmax_replicas = 2\n`,
      (c: AppConfig) => c.scaling.minReplicas === 2,
    ],
    [
      "grace of one second",
      `${CORTEX}[scaling]\nresponse_grace_period = 1\n`,
      (c: AppConfig) => c.scaling.responseGracePeriod === 1,
    ],
  ])("accepted: %s", (_name, text, check) => {
    expect(check(parseAppConfig(text))).toBe(true);
  });

  it.each([
    [
      "grace over 12 h",
      `${CORTEX}\n[scaling]\nresponse_grace_period = 50000\n`,
      "skiff.toml:10: scaling.response_grace_period must be between 1 and 43200, got 50000",
    ],
    [
      "grace of zero",
      `${CORTEX}\n[scaling]\nresponse_grace_period = 0\n`,
      "skiff.toml:10: scaling.response_grace_period must be between 1 and 43200, got 0",
    ],
    [
      "bad type",
      `${CORTEX}\n[scaling]\nmax_replicas = "4"\n`,
      'skiff.toml:10: scaling.max_replicas must be an integer, got a string ("4")',
    ],
    [
      "fraction",
      `${CORTEX}\n[scaling]\ncooldown = 1.5\n`,
      "skiff.toml:10: scaling.cooldown must be an integer, got a number (1.5)",
    ],
    [
      "max of zero",
      `${CORTEX}\n[scaling]\nmax_replicas = 0\n`,
      "skiff.toml:10: scaling.max_replicas must be between 1 and 100, got 0",
    ],
    [
      "min over max",
      `${CORTEX}\n[scaling]\nmin_replicas = 3\n`,
      "skiff.toml:10: scaling.min_replicas must not be more than scaling.max_replicas (2), got 3",
    ],
    [
      "upper-case name",
      CORTEX.replace('"hello"', '"Hello"'),
      'skiff.toml:2: app.name must be 1 to 63 lowercase letters, digits or "-", starting with a letter or a digit, got "Hello"',
    ],
    ["name starting with a dash", CORTEX.replace('"hello"', '"-app"'), "skiff.toml:2: app.name must be 1 to 63"],
    ["name of 64", CORTEX.replace('"hello"', `"a${"b".repeat(63)}"`), "skiff.toml:2: app.name must be 1 to 63"],
    ["missing name", CORTEX.replace('name = "hello"', ""), "skiff.toml:1: app.name is required"],
    [
      "unknown kind",
      CORTEX.replace('"cortex"', '"lambda"'),
      'skiff.toml:5: runtime.kind must be one of "cortex", "custom", got "lambda"',
    ],
    [
      "unknown language",
      CORTEX.replace('"python"', '"ruby"'),
      'skiff.toml:6: runtime.language must be one of "python", "node", got "ruby"',
    ],
    [
      "entry escaping the folder",
      CORTEX.replace("main.py", "../main.py"),
      'skiff.toml:7: runtime.entry must be a relative path inside the app folder, got "../main.py"',
    ],
    [
      "absolute entry",
      CORTEX.replace("main.py", "/etc/main.py"),
      "skiff.toml:7: runtime.entry must be a relative path inside the app folder",
    ],
    [
      "entry of the wrong language",
      CORTEX.replace("main.py", "main.js"),
      'skiff.toml:7: runtime.entry must be a .py file for language "python", got "main.js"',
    ],
    [
      "missing entry",
      CORTEX.replace('entry = "main.py"', ""),
      "skiff.toml:4: runtime.entry is required for a cortex app",
    ],
    ["custom key on cortex", `${CORTEX}command = ["x"]\n`, 'skiff.toml:8: runtime.command is only for kind = "custom"'],
    ["cortex key on custom", `${CUSTOM}entry = "main.py"\n`, 'skiff.toml:7: runtime.entry is only for kind = "cortex"'],
    [
      "empty command",
      CUSTOM.replace('["node", "server.js"]', "[]"),
      "skiff.toml:6: runtime.command must be a non-empty array of strings",
    ],
    [
      "command not strings",
      CUSTOM.replace('["node", "server.js"]', '["node", 3]'),
      "skiff.toml:6: runtime.command must be a non-empty array of strings",
    ],
    [
      "command as a string",
      CUSTOM.replace('["node", "server.js"]', '"node server.js"'),
      "skiff.toml:6: runtime.command must be a non-empty array of strings",
    ],
    [
      "healthcheck not a path",
      `${CUSTOM}healthcheck = "health"\n`,
      'skiff.toml:7: runtime.healthcheck must be a URL path starting with "/", got "health"',
    ],
    [
      "port out of range",
      `${CUSTOM}port = 70000\n`,
      "skiff.toml:7: runtime.port must be between 1 and 65535, got 70000",
    ],
    ["PORT in env", `${CORTEX}\n[env]\nPORT = "80"\n`, "skiff.toml:10: env.PORT is reserved"],
    [
      "env value not a string",
      `${CORTEX}\n[env]\nDEBUG = true\n`,
      "skiff.toml:10: env.DEBUG must be a string, got a boolean (true)",
    ],
    [
      "env name invalid",
      `${CORTEX}\n[env]\n"MY-VAR" = "x"\n`,
      "skiff.toml:10: env.MY-VAR is not a valid variable name",
    ],
    ["unknown key", `${CORTEX}\n[scaling]\nmax_replica = 3\n`, "skiff.toml:10: scaling.max_replica is not a known key"],
    ["unknown table", `${CORTEX}\n[deploy]\nx = 1\n`, "skiff.toml:9: deploy is not a known table"],
    ["unknown build key", `${CORTEX}\n[build]\nx = 1\n`, "skiff.toml:10: build.x is not a known key"],
    [
      "build secrets not names",
      `${CORTEX}\n[build]\nsecrets = ["HF-TOKEN"]\n`,
      'skiff.toml:10: build.secrets must hold secret names (letters, digits and _), got "HF-TOKEN"',
    ],
    [
      "build secrets not a list",
      `${CORTEX}\n[build]\nsecrets = true\n`,
      "skiff.toml:10: build.secrets must be an array of secret names (strings), got a boolean (true)",
    ],
    ["missing runtime", '[app]\nname = "x"\n', "skiff.toml:1: runtime is required"],
    ["table given as a value", `${CORTEX}scaling = 3\n`, "skiff.toml:8: runtime.scaling is not a known key"],
  ])("refused: %s", (_name, text, expected) => {
    const lines = issues(text);
    expect(
      lines.some((l) => l.startsWith(expected)),
      lines.join("\n"),
    ).toBe(true);
  });

  it("every problem is listed, in line order, not only the first", () => {
    const text = `[app]\nname = "Bad"\n\n[runtime]\nkind = "cortex"\nlanguage = "ruby"\nentry = "main.py"\n\n[scaling]\ncooldown = -1\nresponse_grace_period = 50000\nextra = 1\n`;
    let error: AppConfigError | undefined;
    try {
      parseAppConfig(text);
    } catch (err) {
      error = err as AppConfigError;
    }
    expect(error?.issues.map((i) => [i.key, i.line])).toEqual([
      ["app.name", 2],
      ["runtime.language", 6],
      ["scaling.cooldown", 10],
      ["scaling.response_grace_period", 11],
      ["scaling.extra", 12],
    ]);
  });

  it("a TOML syntax error gives its line and column", () => {
    expect(issues('[app]\nname = "x"\n[runtime]\nkind = = "cortex"\n')).toEqual([
      "skiff.toml:4: invalid TOML at line 4, column 8: invalid value",
    ]);
    expect(issues('[app]\nname = "x"\nname = "y"\n')[0]).toMatch(/^skiff\.toml:3: invalid TOML at line 3/);
    // The common slips, said as what to mend.
    expect(issues('[app]\nname = "x\n[runtime]\n')).toEqual([
      "skiff.toml:2: invalid TOML at line 2, column 10: control characters are not allowed in strings (a string is not closed on its line: its closing quote is missing)",
    ]);
    expect(issues("[app]\nname = hello\n")).toEqual([
      'skiff.toml:2: invalid TOML at line 2, column 8: invalid value (text needs quotes: key = "value")',
    ]);
  });

  it("lines are found past multi-line arrays and strings", () => {
    const text = `[app]\nname = "web"\n[runtime]\nkind = "custom"\ncommand = [\n  "node",\n  "a=b",\n]\n[env]\nNOTE = """\nx = 1\n"""\n[scaling]\ncooldown = 0\n`;
    expect(issues(text)).toEqual(["skiff.toml:14: scaling.cooldown must be between 1 and 86400, got 0"]);
  });

  it("a table named like a property of every object ([constructor], [toString]) is still unknown", () => {
    for (const name of ["constructor", "toString", "__proto__", "hasOwnProperty"]) {
      expect(issues(`${CUSTOM}\n["${name}"]\nx = 1\n`)).toEqual([
        `skiff.toml:8: ${name} is not a known table; tables are [app], [runtime], [env], [scaling], [cors], [build]`,
      ]);
    }
  });

  it("[cors] allow_origins: origins as browsers send them, or *; duplicates once; empty is none", () => {
    const config = parseAppConfig(
      `${CUSTOM}\n[cors]\nallow_origins = ["https://app.example", "http://localhost:3000", "*", "https://app.example"]\n`,
    );
    expect(config.cors).toEqual({ allowOrigins: ["https://app.example", "http://localhost:3000", "*"] });
    expect(parseAppConfig(`${CUSTOM}\n[cors]\nallow_origins = []\n`).cors).toBeUndefined();
    expect(parseAppConfig(CUSTOM).cors).toBeUndefined();
    for (const bad of ["https://app.example/", "https://app.example/path", "ftp://x.example", "null", "app.example"])
      expect(issues(`${CUSTOM}\n[cors]\nallow_origins = ["${bad}"]\n`)[0]).toMatch(
        /^skiff\.toml:9: cors\.allow_origins must hold origins such as "https:\/\/example\.com"/,
      );
    expect(issues(`${CUSTOM}\n[cors]\nallow_origins = "*"\n`)).toEqual([
      'skiff.toml:9: cors.allow_origins must be an array of origins (strings), got a string ("*")',
    ]);
    expect(issues(`${CUSTOM}\n[cors]\norigins = ["*"]\n`)).toEqual([
      "skiff.toml:9: cors.origins is not a known key; keys of [cors] are allow_origins",
    ]);
  });

  it("an env variable named __proto__ is kept like any other", () => {
    const config = parseAppConfig(`${CUSTOM}\n[env]\n"__proto__" = "x"\nconstructor = "y"\n`);
    expect(Object.entries(config.env).sort()).toEqual([
      ["__proto__", "x"],
      ["constructor", "y"],
    ]);
  });

  it("the file name given is used in messages", () => {
    expect(() => parseAppConfig("[app]\n", "apps/x/skiff.toml")).toThrow(
      /^apps\/x\/skiff\.toml:1: app\.name is required/,
    );
  });

  describe("loadAppConfig", () => {
    let dir: string;
    afterAll(() => rm(dir, { recursive: true, force: true }));

    it("checks that the entry exists in the folder", async () => {
      dir = await mkdtemp(path.join(tmpdir(), "skiff-app-"));
      await writeFile(path.join(dir, "skiff.toml"), CORTEX);
      await expect(loadAppConfig(dir)).rejects.toThrow(
        'skiff.toml:7: runtime.entry names a file that is not in the app folder: "main.py"',
      );
      await writeFile(path.join(dir, "main.py"), "def run():\n    return 1\n");
      expect((await loadAppConfig(dir)).app.name).toBe("hello");
    });

    it("a folder without skiff.toml is a clear error", async () => {
      await expect(loadAppConfig(path.join(tmpdir(), "skiff-no-such-dir"))).rejects.toThrow(
        /cannot read .*skiff\.toml/,
      );
    });
  });
});
