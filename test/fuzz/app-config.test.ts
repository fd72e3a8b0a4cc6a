// Fuzzing skiff.toml: arbitrary text, and arbitrary TOML-shaped objects
// written out by smol-toml. parseAppConfig gives a valid config or throws an
// AppConfigError whose every issue names its key (or "" for a syntax error)
// and a line of the file; never an exception of another type.
import assert from "node:assert/strict";
import fc from "fast-check";
import { stringify } from "smol-toml";
import { describe, expect, it } from "vitest";
import {
  APP_NAME_PATTERN,
  AppConfigError,
  MAX_COOLDOWN,
  MAX_REPLICAS_LIMIT,
  MAX_REPLICA_CONCURRENCY,
  parseAppConfig,
  type AppConfig,
} from "../../services/apps/app-config.js";
import { MAX_RUN_SECONDS } from "../../services/config/index.js";
import { FUZZ_RUNS, fuzzTimeout } from "./runs.js";

const TABLES = ["app", "runtime", "env", "scaling"];
/** Keys that name properties of every JavaScript object: a lookup that forgets this takes them as known. */
const PROTO_KEYS = ["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf", "prototype"];

type Outcome = { config: AppConfig } | { error: AppConfigError };

/** Parses, and checks the invariants of whichever comes out (plain asserts: expect() is slow at 10,000 cases). */
function parseChecked(text: string): Outcome {
  let config: AppConfig;
  try {
    config = parseAppConfig(text);
  } catch (err) {
    assert.ok(err instanceof AppConfigError, `not an AppConfigError: ${String(err)}`);
    assert.ok(err.issues.length > 0, "an error without issues");
    const lines = text.split(/\r\n|\n|\r/).length;
    for (const issue of err.issues) {
      assert.equal(typeof issue.key, "string");
      assert.ok(Number.isInteger(issue.line) && issue.line >= 1 && issue.line <= lines + 1, `line ${issue.line}`);
      // A key's message starts with the key; a syntax error's says where it is.
      if (issue.key !== "") assert.ok(issue.message.startsWith(`${issue.key} `), issue.message);
      else assert.match(issue.message, /^invalid TOML at line \d+, column \d+: /);
      assert.ok(err.message.includes(`skiff.toml:${issue.line}: ${issue.message}`), err.message);
    }
    return { error: err };
  }
  assert.match(config.app.name, APP_NAME_PATTERN);
  if (config.runtime.kind === "cortex") {
    assert.ok(["python", "node"].includes(config.runtime.language));
    assert.doesNotMatch(config.runtime.entry, /^(\/|\.\.(\/|$))/);
  } else {
    assert.equal(config.runtime.kind, "custom");
    assert.ok(config.runtime.command.length > 0);
    for (const arg of config.runtime.command) assert.equal(typeof arg, "string");
    assert.ok(config.runtime.healthcheck.startsWith("/"));
  }
  for (const value of Object.values(config.env)) assert.equal(typeof value, "string");
  const s = config.scaling;
  const within = (v: number, min: number, max: number) => assert.ok(Number.isInteger(v) && v >= min && v <= max);
  within(s.minReplicas, 0, s.maxReplicas);
  within(s.maxReplicas, 1, MAX_REPLICAS_LIMIT);
  within(s.replicaConcurrency, 1, MAX_REPLICA_CONCURRENCY);
  within(s.cooldown, 1, MAX_COOLDOWN);
  within(s.responseGracePeriod, 1, MAX_RUN_SECONDS);
  return { config };
}

// Arbitrary text: any characters, and lines made of TOML's own pieces.
const FRAGMENTS = [
  "[app]",
  "[runtime]",
  "[env]",
  "[scaling]",
  "[[app]]",
  "[app.x]",
  "[constructor]",
  'name = "hello"',
  'name = "Hello World"',
  'kind = "cortex"',
  'kind = "custom"',
  'language = "python"',
  'language = "node"',
  'entry = "main.py"',
  'entry = "../x.py"',
  'command = ["node", "server.js"]',
  "command = [",
  '"a",',
  "]",
  'healthcheck = "/h"',
  "port = 8080",
  "min_replicas = 3",
  "max_replicas = 1",
  "cooldown = 0",
  "response_grace_period = 99999",
  'PORT = "1"',
  '"__proto__" = "x"',
  'A = """',
  "'''",
  '"""',
  "x = { a = 1 }",
  "a.b.c = 1",
  "= 1",
  "#",
  "",
  " ",
  "\t",
  "x = 1979-05-27T07:32:00Z",
  "x = inf",
  "x = 0x10",
];
const tomlish = fc
  .array(
    fc.oneof(
      { weight: 5, arbitrary: fc.constantFrom(...FRAGMENTS) },
      { weight: 1, arbitrary: fc.string({ maxLength: 20 }) },
    ),
    { maxLength: 25 },
  )
  .chain((lines) => fc.constantFrom("\n", "\r\n").map((eol) => lines.join(eol)));
const text = fc.oneof(
  { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 300 }) },
  { weight: 1, arbitrary: fc.string({ unit: "grapheme-ascii", maxLength: 300 }) },
  { weight: 4, arbitrary: tomlish },
);

// TOML-shaped objects: the known tables with values of every type, and keys that are not ours.
const date = fc.date({
  min: new Date("1970-01-01T00:00:00Z"),
  max: new Date("2100-01-01T00:00:00Z"),
  noInvalidDate: true,
});
const scalar = fc.oneof(
  fc.string({ maxLength: 16 }),
  fc.integer({ min: -5, max: 100_000 }),
  fc.integer(),
  fc.double({ noNaN: true }),
  fc.boolean(),
  date,
);
const anyKey = fc.oneof(fc.constantFrom(...PROTO_KEYS), fc.string({ minLength: 1, maxLength: 10 }));
const { value } = fc.letrec<{ value: unknown; table: Record<string, unknown> }>((tie) => ({
  value: fc.oneof(
    { maxDepth: 2, depthSize: "xsmall", withCrossShrink: true },
    scalar,
    fc.array(tie("value"), { maxLength: 3 }),
    tie("table"),
  ),
  table: fc.dictionary(anyKey, tie("value"), { maxKeys: 3 }),
}));
/** Mostly a value of the key's own kind, sometimes any value, sometimes left out. */
const maybe = <T>(arb: fc.Arbitrary<T>) =>
  fc.oneof(
    { weight: 16, arbitrary: arb },
    { weight: 1, arbitrary: value },
    { weight: 2, arbitrary: fc.constant(undefined) },
  );
/** Mostly right, sometimes anything: most documents are close to valid, so both outcomes are checked. */
const mostly = <T>(right: fc.Arbitrary<T>, wrong: fc.Arbitrary<T>) =>
  fc.oneof({ weight: 8, arbitrary: right }, { weight: 1, arbitrary: wrong });

const appName = mostly(
  fc.stringMatching(/^[a-z][a-z0-9-]{0,62}$/),
  fc.oneof(fc.constantFrom("a".repeat(63), "a".repeat(64), "Hello", "1a", "-a", ""), fc.string({ maxLength: 70 })),
);
const appTable = fc.record({ name: maybe(appName) }, { noNullPrototype: true });
const path_ = fc.oneof(
  fc.constantFrom("/health", "/", "health", "/a b", ""),
  fc.stringMatching(/^\/[a-z0-9/._-]{0,12}$/),
  fc.string(),
);
const cortex = fc.record(
  {
    kind: fc.constant("cortex"),
    language: maybe(mostly(fc.constantFrom("python", "node"), fc.constantFrom("ruby", "", "Python"))),
    entry: maybe(
      mostly(
        fc.constantFrom("main.py", "a/b.py", "./x.py", "app.js", "x.mjs", "lib/y.cjs", "a\\b.py"),
        fc.oneof(fc.constantFrom("../x.py", "/abs.py", "..\\x.py", "./", "", "a/../../x.py"), fc.string()),
      ),
    ),
  },
  { requiredKeys: ["kind"] },
);
const custom = fc.record(
  {
    kind: fc.constant("custom"),
    command: maybe(
      mostly(
        fc.array(fc.string({ minLength: 1, maxLength: 8 }), { minLength: 1, maxLength: 3 }),
        fc.array(fc.oneof(fc.string({ maxLength: 8 }), value), { maxLength: 3 }),
      ),
    ),
    healthcheck: maybe(path_),
    readycheck: maybe(path_),
    port: maybe(fc.integer({ min: -2, max: 70_000 })),
  },
  { requiredKeys: ["kind"] },
);
const anyRuntime = fc.record(
  {
    kind: maybe(fc.constantFrom("cortex", "custom", "CORTEX", "")),
    language: maybe(fc.constantFrom("python", "node")),
    entry: maybe(fc.string()),
    command: maybe(fc.array(fc.string({ maxLength: 8 }), { maxLength: 2 })),
    port: maybe(fc.integer()),
  },
  { noNullPrototype: true },
);
const runtimeTable = fc.oneof({ weight: 4, arbitrary: cortex }, { weight: 4, arbitrary: custom }, anyRuntime);
const envName = mostly(
  fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,8}$/),
  fc.oneof(fc.constantFrom("PORT", "1A", "", "A-B", ...PROTO_KEYS), fc.string({ maxLength: 8 })),
);
const envTable = fc.dictionary(envName, mostly<unknown>(fc.string({ maxLength: 12 }), value), { maxKeys: 4 });
const count = (max: number) =>
  mostly(
    fc.integer({ min: 1, max }),
    fc.oneof(fc.integer({ min: -2, max: 1_002 }), fc.integer({ min: 40_000, max: 90_000 })),
  );
const scalingTable = fc.record(
  {
    min_replicas: maybe(fc.integer({ min: 0, max: 3 })),
    max_replicas: maybe(count(100)),
    replica_concurrency: maybe(count(1000)),
    cooldown: maybe(count(86_400)),
    response_grace_period: maybe(count(43_200)),
  },
  { noNullPrototype: true },
);
/** Sometimes one key that is not ours (or named like a property of every object). */
const withExtra = (arb: fc.Arbitrary<Record<string, unknown>>) =>
  fc
    .tuple(
      arb,
      fc.oneof({ weight: 6, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.tuple(anyKey, value) }),
    )
    .map(([t, extra]) => {
      const out = Object.fromEntries(Object.entries(t).filter(([, v]) => v !== undefined));
      if (extra !== null) Object.defineProperty(out, extra[0], { value: extra[1], enumerable: true });
      return out;
    });
const document = withExtra(
  fc.record(
    {
      app: maybe(withExtra(appTable)),
      runtime: maybe(withExtra(runtimeTable)),
      env: maybe(envTable),
      scaling: maybe(withExtra(scalingTable)),
    },
    { noNullPrototype: true },
  ),
);

/** smol-toml writes what it can; a value TOML cannot hold (a top-level scalar, mixed nesting it refuses) is skipped. */
function toToml(doc: Record<string, unknown>): string | undefined {
  try {
    return stringify(doc);
  } catch {
    return undefined;
  }
}

describe("fuzz: skiff.toml", () => {
  it(
    `arbitrary text: a config or an AppConfigError naming key and line (${FUZZ_RUNS} cases)`,
    () => {
      fc.assert(
        fc.property(text, (t) => {
          parseChecked(t);
        }),
        { numRuns: FUZZ_RUNS },
      );
    },
    fuzzTimeout(15),
  );

  it(
    `arbitrary TOML-shaped objects: unknown tables and keys are named, a config keeps what was written (${FUZZ_RUNS} cases)`,
    () => {
      let written = 0;
      let configs = 0;
      fc.assert(
        fc.property(document, (doc) => {
          const t = toToml(doc);
          if (t === undefined) return;
          written++;
          const outcome = parseChecked(t);
          const unknown = Object.keys(doc).filter((k) => !TABLES.includes(k));
          if ("error" in outcome) {
            const keys = outcome.error.issues.map((i) => i.key);
            for (const k of unknown) assert.ok(keys.includes(k), `unknown table ${k} not named: ${keys.join(", ")}`);
            return;
          }
          assert.deepEqual(unknown, []);
          configs++;
          const { config } = outcome;
          assert.equal(config.app.name, (doc.app as Record<string, unknown>).name);
          // Every variable written is there, as written.
          assert.deepEqual(Object.entries(config.env).sort(), Object.entries(doc.env ?? {}).sort());
          if (config.runtime.kind === "custom")
            assert.deepEqual(config.runtime.command, (doc.runtime as Record<string, unknown>).command);
        }),
        { numRuns: FUZZ_RUNS },
      );
      // Most documents must reach the parser, or the property says little.
      expect(written).toBeGreaterThan(FUZZ_RUNS / 2);
      console.log(`skiff.toml objects: ${written} written, ${configs} valid configs`);
      // ... and some must be valid, or "a config keeps what was written" is never checked.
      expect(configs).toBeGreaterThan(FUZZ_RUNS / 200);
    },
    fuzzTimeout(15),
  );
});
