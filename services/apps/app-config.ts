// An app's skiff.toml: parsed with smol-toml, then validated key by key so
// that every problem is reported at once, each with the key and its line
// ("skiff.toml:12: scaling.response_grace_period must be between 1 and
// 43200, got 50000"). The result has every default applied; its runtime and
// scaling fields mirror the Runtime and Scaling messages of the management
// API so they convert one to one.
import { readFile, stat } from "node:fs/promises";
import path from "node:path";
import { parse, TomlError } from "smol-toml";
import { MAX_RUN_SECONDS } from "../config/index.js";
import { SHELL_NUMBER, SHELL_NUMBER_PROBLEM } from "../secrets/names.js";
import { APP_CONFIG_FILE } from "./bundle.js";

export const DEFAULT_HEALTHCHECK = "/health";
export const DEFAULT_MIN_REPLICAS = 0;
export const DEFAULT_MAX_REPLICAS = 2;
export const DEFAULT_REPLICA_CONCURRENCY = 1;
/** Seconds a replica may sit idle before it stops. */
export const DEFAULT_COOLDOWN = 30;
/** Seconds a run may take (spec section 2: 15 minutes). */
export const DEFAULT_RESPONSE_GRACE_PERIOD = 900;
/** Upper bounds that keep one app from taking a machine by a typo. */
export const MAX_REPLICAS_LIMIT = 100;
export const MAX_REPLICA_CONCURRENCY = 1000;
export const MAX_COOLDOWN = 86_400;

export interface CortexRuntime {
  kind: "cortex";
  language: "python" | "node";
  /** Path of the module inside the app folder, with forward slashes. */
  entry: string;
}

export interface CustomRuntime {
  kind: "custom";
  command: string[];
  healthcheck: string;
  readycheck?: string;
  /** A fixed port for an app that cannot read PORT: one replica per machine. */
  port?: number;
}

export interface Scaling {
  minReplicas: number;
  maxReplicas: number;
  replicaConcurrency: number;
  /** Seconds. */
  cooldown: number;
  /** Seconds, 1 to 43200. */
  responseGracePeriod: number;
}

/**
 * Deploy-time steps beyond skiff.toml's own (a requirements.txt or
 * package.json in the folder): what a cerebrium.toml declares.
 */
export interface AppBuild {
  /** Run in order with /bin/sh -c in the build sandbox, before the installs. */
  preBuildCommands: string[];
  /** Run in order with /bin/sh -c in the build sandbox, after the installs. */
  shellCommands: string[];
  /** Python requirements as pip reads them, one each ("numpy", "pydantic>=1.10"). */
  pip: string[];
  /** Requirements files in the app folder, relative, with forward slashes. */
  pipFiles: string[];
  /** npm packages ("left-pad", "left-pad@1.3.0"). */
  npm: string[];
  /** Debian packages the machine must have (checked, never installed). */
  apt: string[];
  /** Conda packages the machine must have, as a Debian package or a Python distribution (checked, never installed). */
  conda: string[];
  /** Files in the app folder listing more apt and conda packages, one a line. */
  aptFiles: string[];
  condaFiles: string[];
}

/** What a replica may use: its limits, when the config names them. */
export interface AppResources {
  /** CPUs (a fraction is allowed). */
  cpu?: number;
  /** Memory, MiB. */
  memoryMb?: number;
}

export interface AppConfig {
  app: { name: string };
  runtime: CortexRuntime | CustomRuntime;
  /** The app's own environment, given to its replicas as it is. */
  env: Record<string, string>;
  scaling: Scaling;
  /** `[cors]`: origins whose browsers may call the app (skiff answers their preflights); absent: CORS is the app's. */
  cors?: { allowOrigins: string[] };
  /** `[build] secrets`: names of project secrets the build steps get as environment variables; absent: none. */
  buildSecrets?: string[];
  /** The file it was read from, when not skiff.toml. */
  source?: "cerebrium.toml";
  build?: AppBuild;
  /** Which files of the folder the bundle holds (fnmatch globs, "/"-separated relative paths). */
  files?: { include: string[]; exclude: string[] };
  resources?: AppResources;
}

/** The most origins one app's `cors.allow_origins` lists. */
export const MAX_CORS_ORIGINS = 100;

export interface AppConfigIssue {
  /** Dotted key ("scaling.cooldown"), or "" for a TOML syntax error. */
  key: string;
  line: number;
  message: string;
}

/** The issues a refusal says, at most, and the characters of each: it goes back whole in any protocol's error. */
const MAX_SAID_ISSUES = 50;
const MAX_ISSUE_CHARS = 1000;

export class AppConfigError extends Error {
  override name = "AppConfigError";
  constructor(
    readonly file: string,
    readonly issues: AppConfigIssue[],
    options?: ErrorOptions,
  ) {
    // A file of many mistakes, or of long names, is said in part: a gRPC caller gets a message as a trailer,
    // which a megabyte of them would not fit (the caller got "internal" instead).
    const said = issues
      .slice(0, MAX_SAID_ISSUES)
      .map((i) => `${file}:${i.line}: ${i.message.slice(0, MAX_ISSUE_CHARS)}`);
    if (issues.length > MAX_SAID_ISSUES) said.push(`${file}: ${issues.length - MAX_SAID_ISSUES} more issues not shown`);
    super(said.join("\n"), options);
  }
}

/** 1 to 63 of a-z, 0-9 and "-", not starting with "-" (a leading digit is safe in subjects, keys and paths). */
export const APP_NAME_PATTERN = /^[a-z0-9][a-z0-9-]{0,62}$/;
export const APP_NAME_RULE = '1 to 63 lowercase letters, digits or "-", starting with a letter or a digit';
const ENV_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;

const KEYS: Record<string, readonly string[]> = {
  app: ["name"],
  runtime: ["kind", "language", "entry", "command", "healthcheck", "readycheck", "port"],
  scaling: ["min_replicas", "max_replicas", "replica_concurrency", "cooldown", "response_grace_period"],
  cors: ["allow_origins"],
  build: ["secrets"],
};
const CORTEX_KEYS = ["kind", "language", "entry"];
const CUSTOM_KEYS = ["kind", "command", "healthcheck", "readycheck", "port"];

export type Table = Record<string, unknown>;

export function isTable(v: unknown): v is Table {
  return (
    typeof v === "object" &&
    v !== null &&
    !Array.isArray(v) &&
    !(v instanceof Date) &&
    Object.getPrototypeOf(v) === null
  );
}

export function describe(v: unknown): string {
  if (Array.isArray(v)) return "an array";
  if (isTable(v)) return "a table";
  if (typeof v === "string") return `a string (${JSON.stringify(v)})`;
  if (typeof v === "number") return Number.isInteger(v) ? `an integer (${v})` : `a number (${v})`;
  if (typeof v === "boolean") return `a boolean (${v})`;
  return "a date";
}

/**
 * Where each key is written: "table" and "table.key" to 1-based lines. A
 * small scanner rather than a second parser, good enough to point at a line;
 * a key it cannot place points at its table's line, else line 1. Keys of
 * more than KEY_PARTS parts or KEY_CHARS characters are not placed: a
 * tenant's `[a.a.a.…]` of 100,000 parts would otherwise make every prefix
 * a key (quadratic time and memory, enough to end the process).
 */
export function keyLines(text: string): Map<string, number> {
  const KEY_PARTS = 16;
  const KEY_CHARS = 1024;
  const lines = new Map<string, number>();
  const clean = (k: string) =>
    k
      .split(".")
      .map((p) => p.trim().replace(/^["']|["']$/g, ""))
      .join(".");
  let table = "";
  let deep = false; // the table has too many parts to be placed
  let depth = 0; // open brackets of a multi-line array
  let inString = false; // inside a ''' or """ string
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    const quotes = (line.match(/"""|'''/g) ?? []).length;
    if (inString) {
      if (quotes % 2 === 1) inString = false;
      return;
    }
    if (depth > 0) {
      depth += (line.match(/\[/g) ?? []).length - (line.match(/]/g) ?? []).length;
      return;
    }
    const header = /^\[\[?([^\]]+)]]?/.exec(line);
    if (header) {
      table = header[1].length > KEY_CHARS ? "" : clean(header[1]);
      deep = header[1].length > KEY_CHARS || table.split(".").length > KEY_PARTS;
      if (deep) return;
      // The table and the tables it is in ([a.b] also places "a" when nothing else did).
      const parts = table.split(".");
      for (let n = 1; n <= parts.length; n++) {
        const prefix = parts.slice(0, n).join(".");
        if (!lines.has(prefix)) lines.set(prefix, i + 1);
      }
      return;
    }
    const assign = /^((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=(.*)$/.exec(
      line,
    );
    if (!assign) return;
    if (!deep && assign[1].length <= KEY_CHARS) {
      const key = table === "" ? clean(assign[1]) : `${table}.${clean(assign[1])}`;
      if (key.split(".").length <= KEY_PARTS && !lines.has(key)) lines.set(key, i + 1);
    }
    const value = assign[2].replace(/#.*$/, "");
    if (quotes % 2 === 1) inString = true;
    else depth = Math.max(0, (value.match(/\[/g) ?? []).length - (value.match(/]/g) ?? []).length);
  });
  return lines;
}

export class Checker {
  readonly issues: AppConfigIssue[] = [];
  constructor(private readonly lines: Map<string, number>) {}

  lineOf(key: string): number {
    for (let k = key; k !== ""; k = k.includes(".") ? k.slice(0, k.lastIndexOf(".")) : "") {
      const line = this.lines.get(k);
      if (line !== undefined) return line;
    }
    return 1;
  }

  fail(key: string, message: string): undefined {
    this.issues.push({ key, line: this.lineOf(key), message: `${key} ${message}` });
    return undefined;
  }

  string(t: Table, table: string, name: string): string | undefined {
    const v = t[name];
    if (v === undefined) return undefined;
    if (typeof v !== "string") return this.fail(`${table}.${name}`, `must be a string, got ${describe(v)}`);
    return v;
  }

  integer(t: Table, table: string, name: string, fallback: number, min: number, max: number): number | undefined {
    const v = t[name];
    if (v === undefined) return fallback;
    if (typeof v !== "number" || !Number.isInteger(v))
      return this.fail(`${table}.${name}`, `must be an integer, got ${describe(v)}`);
    if (v < min || v > max) return this.fail(`${table}.${name}`, `must be between ${min} and ${max}, got ${v}`);
    return v;
  }

  oneOf<T extends string>(t: Table, table: string, name: string, choices: readonly T[]): T | undefined {
    const v = this.string(t, table, name);
    if (v === undefined) {
      if (t[name] === undefined)
        this.fail(`${table}.${name}`, `is required: one of ${choices.map((c) => `"${c}"`).join(", ")}`);
      return undefined;
    }
    if (!(choices as readonly string[]).includes(v))
      return this.fail(`${table}.${name}`, `must be one of ${choices.map((c) => `"${c}"`).join(", ")}, got "${v}"`);
    return v as T;
  }

  table(doc: Table, name: string): Table {
    const v = doc[name];
    if (v === undefined) return Object.create(null) as Table;
    if (!isTable(v)) {
      this.fail(name, `must be a table, got ${describe(v)}`);
      return Object.create(null) as Table;
    }
    return v;
  }

  unknownKeys(t: Table, table: string, allowed: readonly string[]): void {
    for (const k of Object.keys(t))
      if (!allowed.includes(k))
        this.fail(`${table}.${k}`, `is not a known key; keys of [${table}] are ${allowed.join(", ")}`);
  }

  /** Known [runtime] keys that belong to the other kind. */
  misplaced(t: Table, allowed: readonly string[], otherKind: string): void {
    for (const k of Object.keys(t))
      if (KEYS.runtime.includes(k) && !allowed.includes(k))
        this.fail(`runtime.${k}`, `is only for kind = "${otherKind}"`);
  }
}

function checkApp(c: Checker, t: Table): string | undefined {
  c.unknownKeys(t, "app", KEYS.app);
  const name = c.string(t, "app", "name");
  if (name === undefined) {
    if (t.name === undefined) c.fail("app.name", "is required");
    return undefined;
  }
  if (!APP_NAME_PATTERN.test(name)) {
    return c.fail("app.name", `must be ${APP_NAME_RULE}, got "${name}"`);
  }
  return name;
}

function checkPath(c: Checker, t: Table, name: string): string | undefined {
  const v = c.string(t, "runtime", name);
  if (v !== undefined && !/^\/[\x21-\x7e]*$/.test(v))
    return c.fail(`runtime.${name}`, `must be a URL path starting with "/", got "${v}"`);
  return v;
}

/** A relative path that stays inside the app folder, with forward slashes. */
function checkEntry(c: Checker, entry: string, language: "python" | "node"): string | undefined {
  const normal = path.posix.normalize(entry.replaceAll("\\", "/"));
  if (entry === "" || path.posix.isAbsolute(normal) || normal === ".." || normal.startsWith("../")) {
    return c.fail("runtime.entry", `must be a relative path inside the app folder, got "${entry}"`);
  }
  const ext = language === "python" ? [".py"] : [".js", ".mjs", ".cjs"];
  if (!ext.includes(path.posix.extname(normal)))
    return c.fail("runtime.entry", `must be a ${ext.join(", ")} file for language "${language}", got "${entry}"`);
  return normal;
}

function checkRuntime(c: Checker, t: Table): AppConfig["runtime"] | undefined {
  c.unknownKeys(t, "runtime", KEYS.runtime);
  const kind = c.oneOf(t, "runtime", "kind", ["cortex", "custom"] as const);
  if (kind === "cortex") {
    c.misplaced(t, CORTEX_KEYS, "custom");
    const language = c.oneOf(t, "runtime", "language", ["python", "node"] as const);
    const raw = c.string(t, "runtime", "entry");
    if (raw === undefined && t.entry === undefined) c.fail("runtime.entry", "is required for a cortex app");
    const entry = raw !== undefined && language ? checkEntry(c, raw, language) : undefined;
    return language && entry ? { kind, language, entry } : undefined;
  }
  if (kind === "custom") {
    c.misplaced(t, CUSTOM_KEYS, "cortex");
    let command: string[] | undefined;
    const raw = t.command;
    if (raw === undefined) c.fail("runtime.command", 'is required for a custom app, e.g. ["node", "server.js"]');
    else if (!Array.isArray(raw) || raw.length === 0 || !raw.every((a) => typeof a === "string") || raw[0] === "") {
      c.fail(
        "runtime.command",
        `must be a non-empty array of strings whose first item names the program, got ${describe(raw)}`,
      );
    } else command = raw as string[];
    const healthcheck = checkPath(c, t, "healthcheck") ?? DEFAULT_HEALTHCHECK;
    const readycheck = checkPath(c, t, "readycheck");
    const port = t.port === undefined ? undefined : c.integer(t, "runtime", "port", 0, 1, 65535);
    if (!command) return undefined;
    const runtime: CustomRuntime = { kind, command, healthcheck };
    if (readycheck !== undefined) runtime.readycheck = readycheck;
    if (port !== undefined) runtime.port = port;
    return runtime;
  }
  return undefined;
}

function checkEnv(c: Checker, t: Table): Record<string, string> {
  // Without a prototype, a variable named __proto__ is kept as the others are.
  const env = Object.create(null) as Record<string, string>;
  for (const [name, value] of Object.entries(t)) {
    if (!ENV_NAME_PATTERN.test(name))
      c.fail(`env.${name}`, "is not a valid variable name: letters, digits and _, not starting with a digit");
    else if (name === "PORT") c.fail("env.PORT", "is reserved: the runner sets PORT for each replica");
    else if (name === SHELL_NUMBER) c.fail(`env.${name}`, SHELL_NUMBER_PROBLEM);
    else if (typeof value !== "string") c.fail(`env.${name}`, `must be a string, got ${describe(value)}`);
    else env[name] = value;
  }
  return env;
}

/** [scaling] (or the same keys in the table named `table`), with its defaults and bounds. */
export function checkScaling(c: Checker, t: Table, table = "scaling"): Scaling | undefined {
  if (table === "scaling") c.unknownKeys(t, "scaling", KEYS.scaling);
  const minReplicas = c.integer(t, table, "min_replicas", DEFAULT_MIN_REPLICAS, 0, MAX_REPLICAS_LIMIT);
  const maxReplicas = c.integer(t, table, "max_replicas", DEFAULT_MAX_REPLICAS, 1, MAX_REPLICAS_LIMIT);
  const replicaConcurrency = c.integer(
    t,
    table,
    "replica_concurrency",
    DEFAULT_REPLICA_CONCURRENCY,
    1,
    MAX_REPLICA_CONCURRENCY,
  );
  const cooldown = c.integer(t, table, "cooldown", DEFAULT_COOLDOWN, 1, MAX_COOLDOWN);
  const responseGracePeriod = c.integer(
    t,
    table,
    "response_grace_period",
    DEFAULT_RESPONSE_GRACE_PERIOD,
    1,
    MAX_RUN_SECONDS,
  );
  if (minReplicas !== undefined && maxReplicas !== undefined && minReplicas > maxReplicas) {
    c.fail(`${table}.min_replicas`, `must not be more than ${table}.max_replicas (${maxReplicas}), got ${minReplicas}`);
    return undefined;
  }
  if (
    minReplicas === undefined ||
    maxReplicas === undefined ||
    replicaConcurrency === undefined ||
    cooldown === undefined ||
    responseGracePeriod === undefined
  ) {
    return undefined;
  }
  return { minReplicas, maxReplicas, replicaConcurrency, cooldown, responseGracePeriod };
}

/**
 * `[cors] allow_origins`: each an origin as a browser sends it
 * (`https://example.com`, `http://localhost:8080`: scheme, host and port
 * only) or "*" for any. An empty list is none, as an absent one.
 */
function checkCors(c: Checker, t: Table): AppConfig["cors"] {
  c.unknownKeys(t, "cors", KEYS.cors);
  const raw = t.allow_origins;
  if (raw === undefined) return undefined;
  if (!Array.isArray(raw) || !raw.every((o) => typeof o === "string"))
    return c.fail("cors.allow_origins", `must be an array of origins (strings), got ${describe(raw)}`);
  if (raw.length > MAX_CORS_ORIGINS)
    return c.fail("cors.allow_origins", `lists ${raw.length} origins, more than the ${MAX_CORS_ORIGINS} allowed`);
  const origins: string[] = [];
  for (const o of raw as string[]) {
    if (o !== "*" && !isOrigin(o))
      return c.fail(
        "cors.allow_origins",
        `must hold origins such as "https://example.com" (scheme, host and port; no path) or "*", got ${JSON.stringify(o.slice(0, 100))}`,
      );
    if (!origins.includes(o)) origins.push(o);
  }
  return origins.length === 0 ? undefined : { allowOrigins: origins };
}

/** The most secrets one app's build may name. */
const MAX_BUILD_SECRETS = 100;

/**
 * `[build] secrets`: the names of the project's secrets that the build steps
 * (dependency installs) get as environment variables. A name the project
 * has no secret of is left out when the build runs.
 */
function checkBuild(c: Checker, t: Table): string[] | undefined {
  c.unknownKeys(t, "build", KEYS.build);
  const raw = t.secrets;
  if (raw === undefined) return undefined;
  if (!Array.isArray(raw) || !raw.every((n) => typeof n === "string"))
    return c.fail("build.secrets", `must be an array of secret names (strings), got ${describe(raw)}`);
  if (raw.length > MAX_BUILD_SECRETS)
    return c.fail("build.secrets", `lists ${raw.length} names, more than the ${MAX_BUILD_SECRETS} allowed`);
  const bad = (raw as string[]).find((n) => !ENV_NAME_PATTERN.test(n));
  if (bad !== undefined)
    return c.fail(
      "build.secrets",
      `must hold secret names (letters, digits and _), got ${JSON.stringify(bad.slice(0, 100))}`,
    );
  const names = [...new Set(raw as string[])].sort();
  return names.length === 0 ? undefined : names;
}

/** Whether the text is an http(s) origin written as a browser's Origin header writes it. */
function isOrigin(text: string): boolean {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return false;
  }
  return (url.protocol === "http:" || url.protocol === "https:") && url.origin === text;
}

/** What the parser's words mean for the common slips: a string not closed on its line, a text without quotes. */
function tomlHint(text: string, err: TomlError, said: string): string {
  const line = text.split("\n")[err.line - 1] ?? "";
  // The parser reads on past a missing closing quote and stops at the line's end, "a control character".
  if (said === "control characters are not allowed in strings" && err.column > line.replace(/\r$/, "").length)
    return " (a string is not closed on its line: its closing quote is missing)";
  // A bare word where a value goes (`name = hello`); `= =` and the like are left as the parser says them.
  if (said === "invalid value" && /^[A-Za-z_]/.test(line.slice(err.column - 1)))
    return ' (text needs quotes: key = "value")';
  return "";
}

/** The TOML document of a config file; a syntax error is an AppConfigError naming its line. */
export function parseToml(text: string, file: string): Table {
  try {
    return parse(text) as Table;
  } catch (err) {
    if (!(err instanceof TomlError)) throw err;
    const first = err.message.split("\n")[0].replace(/^Invalid TOML document: /, "");
    const message = `invalid TOML at line ${err.line}, column ${err.column}: ${first}${tomlHint(text, err, first)}`;
    throw new AppConfigError(file, [{ key: "", line: err.line, message }], { cause: err });
  }
}

/**
 * Parses and validates a skiff.toml. Throws AppConfigError listing every
 * problem. `file` names the file in messages.
 */
export function parseAppConfig(text: string, file = APP_CONFIG_FILE): AppConfig {
  const doc = parseToml(text, file);
  const c = new Checker(keyLines(text));
  for (const k of Object.keys(doc))
    if (!Object.hasOwn(KEYS, k) && k !== "env")
      c.fail(k, "is not a known table; tables are [app], [runtime], [env], [scaling], [cors], [build]");
  const name =
    doc.app === undefined ? c.fail("app", 'is required: [app] with name = "..."') : checkApp(c, c.table(doc, "app"));
  const runtime =
    doc.runtime === undefined
      ? c.fail("runtime", 'is required: [runtime] with kind = "cortex" or "custom"')
      : checkRuntime(c, c.table(doc, "runtime"));
  const env = checkEnv(c, c.table(doc, "env"));
  const scaling = checkScaling(c, c.table(doc, "scaling"));
  const cors = checkCors(c, c.table(doc, "cors"));
  const buildSecrets = checkBuild(c, c.table(doc, "build"));
  if (c.issues.length > 0 || name === undefined || runtime === undefined || scaling === undefined) {
    throw new AppConfigError(
      file,
      c.issues.sort((a, b) => a.line - b.line),
    );
  }
  return { app: { name }, runtime, env, scaling, ...(cors ? { cors } : {}), ...(buildSecrets ? { buildSecrets } : {}) };
}

/**
 * Reads `dir/skiff.toml` and validates it, and checks that a Cortex entry
 * exists in the folder.
 */
export async function loadAppConfig(dir: string): Promise<AppConfig> {
  const file = path.join(dir, APP_CONFIG_FILE);
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    throw new AppConfigError(
      APP_CONFIG_FILE,
      [{ key: "", line: 1, message: `cannot read ${file}: ${(err as Error).message}` }],
      { cause: err },
    );
  }
  const config = parseAppConfig(text);
  if (config.runtime.kind === "cortex") {
    const entry = path.join(dir, config.runtime.entry);
    const found = await stat(entry).then(
      (s) => s.isFile(),
      () => false,
    );
    if (!found) {
      const line = keyLines(text).get("runtime.entry") ?? 1;
      throw new AppConfigError(APP_CONFIG_FILE, [
        {
          key: "runtime.entry",
          line,
          message: `runtime.entry names a file that is not in the app folder: "${config.runtime.entry}"`,
        },
      ]);
    }
  }
  return config;
}
