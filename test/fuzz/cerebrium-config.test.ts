// Fuzzing cerebrium.toml: TOML-shaped objects under [cerebrium.*] written out
// by smol-toml, and arbitrary text. parseCerebriumConfig gives a valid config
// with warnings or throws an AppConfigError whose every issue names its key
// and a line; never an exception of another type, and never a requirement
// line that pip would read as an option or as two lines.
import assert from "node:assert/strict";
import fc from "fast-check";
import { stringify } from "smol-toml";
import { describe, expect, it } from "vitest";
import { APP_NAME_PATTERN, AppConfigError } from "../../services/apps/app-config.js";
import { parseCerebriumConfig } from "../../services/apps/cerebrium-config.js";
import { FUZZ_RUNS, fuzzTimeout } from "./runs.js";

function parseChecked(text: string): "ok" | "refused" {
  let parsed;
  try {
    parsed = parseCerebriumConfig(text, { machinePython: "3.11.2" });
  } catch (err) {
    assert.ok(err instanceof AppConfigError, `not an AppConfigError: ${String(err)}`);
    assert.ok(err.issues.length > 0, "an error without issues");
    const lines = text.split(/\r\n|\n|\r/).length;
    for (const issue of err.issues)
      assert.ok(Number.isInteger(issue.line) && issue.line >= 1 && issue.line <= lines + 1, `line ${issue.line}`);
    return "refused";
  }
  const { config, warnings } = parsed;
  assert.match(config.app.name, APP_NAME_PATTERN);
  for (const w of warnings) assert.match(w, /^cerebrium\.toml:\d+: /);
  const build = config.build!;
  for (const req of [...build.pip, ...build.npm, ...build.apt, ...build.conda]) {
    assert.doesNotMatch(req, /^-|[\r\n\0]/, req);
  }
  // A pip requirement is never a path, a URL or "name @ url".
  for (const req of build.pip) assert.doesNotMatch(req, /[/\s@:]/, req);
  for (const f of [...build.pipFiles, ...build.aptFiles, ...build.condaFiles])
    assert.doesNotMatch(f, /^(\/|\.\.(\/|$))/);
  if (config.runtime.kind === "custom") assert.ok(config.runtime.command.length > 0);
  if (config.resources?.memoryMb !== undefined) assert.ok(config.resources.memoryMb >= 1);
  return "ok";
}

const scalar = fc.oneof(
  fc.string({ maxLength: 16 }),
  fc.constantFrom("latest", "", "1.2.3", ">=1.0", "1.0\n-r /etc/passwd", "--index-url x", "main.py", "../x"),
  fc.integer({ min: -5, max: 100_000 }),
  fc.double({ noNaN: true }),
  fc.boolean(),
);
const value = fc.oneof(scalar, fc.array(scalar, { maxLength: 4 }));
const key = fc.oneof(
  fc.constantFrom(
    "name",
    "include",
    "exclude",
    "shell_commands",
    "python_version",
    "entrypoint",
    "port",
    "healthcheck_endpoint",
    "cpu",
    "memory",
    "gpu_count",
    "cooldown",
    "min_replicas",
    "max_replicas",
    "pip",
    "numpy",
    "--index-url",
    "__proto__",
  ),
  fc.string({ minLength: 1, maxLength: 8 }),
);
const table = fc.dictionary(key, value, { maxKeys: 6 });
const doc = fc.record(
  {
    deployment: fc.oneof(
      table,
      table.map((t) => ({ ...t, name: "1-app" })),
    ),
    runtime: fc.oneof(
      fc.record({ custom: table }),
      fc.record({ cortex: table }),
      fc.dictionary(key, table, { maxKeys: 2 }),
    ),
    hardware: table,
    scaling: table,
    dependencies: fc.record(
      { pip: table, npm: table, apt: fc.oneof(table, fc.array(scalar, { maxLength: 3 })), conda: table, paths: table },
      { requiredKeys: [] },
    ),
  },
  { requiredKeys: [] },
);

describe("fuzz - cerebrium.toml", () => {
  it(
    "TOML-shaped configs: a valid config with warnings or an AppConfigError, nothing else",
    () => {
      let ok = 0;
      fc.assert(
        fc.property(doc, (d) => {
          let text: string;
          try {
            text = stringify({ cerebrium: d });
          } catch {
            return; // not writable as TOML
          }
          if (parseChecked(text) === "ok") ok++;
        }),
        { numRuns: FUZZ_RUNS },
      );
      expect(ok).toBeGreaterThan(0);
    },
    fuzzTimeout(5),
  );

  it(
    "arbitrary text: an AppConfigError or a config, nothing else",
    () => {
      fc.assert(
        fc.property(fc.string({ unit: "grapheme-ascii", maxLength: 300 }), (t) => void parseChecked(t)),
        { numRuns: FUZZ_RUNS },
      );
    },
    fuzzTimeout(5),
  );
});
