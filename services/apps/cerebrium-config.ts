// An app's cerebrium.toml (the configuration file of apps written for the
// platform the spec documents), read as it is into the same AppConfig as
// skiff.toml, with the same style of errors ("cerebrium.toml:12:
// cerebrium.scaling.cooldown must be ..."). What skiff cannot honour is
// not an error but a warning returned alongside (a GPU, a region, an unknown
// key), so that an app deploys unmodified; a refusal is kept for what the
// app cannot work without (a Dockerfile and no entrypoint). docs/migrating.md
// lists every key and what is done with it.
import path from "node:path";
import { editDistance } from "../config/index.js";
import {
  APP_NAME_PATTERN,
  APP_NAME_RULE,
  type AppBuild,
  type AppConfig,
  AppConfigError,
  Checker,
  type CustomRuntime,
  checkScaling,
  DEFAULT_HEALTHCHECK,
  describe,
  isTable,
  keyLines,
  parseToml,
  type Scaling,
  type Table,
} from "./app-config.js";
import { CEREBRIUM_CONFIG_FILE, DEFAULT_EXCLUDE, DEFAULT_INCLUDE } from "./bundle.js";

/** The entry of a Cortex app on that platform: its `main.py` at the folder's root. */
const CORTEX_ENTRY = "main.py";
/** Most memory a config may ask for, GB, and CPUs: a bound against typos, not a promise of the machine. */
const MAX_MEMORY_GB = 4096;
const MAX_CPU = 1024;
/** Most warnings a config's parse returns (each a line of the app's log): the rest are counted. */
const MAX_WARNINGS = 100;
/** Most characters of the include globs together, and of the exclude globs. */
const MAX_GLOB_CHARS = 4096;
/** Most shell commands, requirements and globs a config may list. */
const MAX_ITEMS = 1000;

/** A package's name as Debian, conda and npm ("@scope/name") write them. */
const PACKAGE_NAME = /^[A-Za-z0-9@][A-Za-z0-9._+/-]{0,213}$/;
/** A Python distribution's name, with extras ("uvicorn[standard]"): never a path, a URL or an option. */
const PIP_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,200}(\[[A-Za-z0-9._,-]{1,200}\])?$/;
/** A version specifier: "latest", a bare version ("1.2.3"), or pip's operators ("==1.2", ">=2,<3", "~=1.0"). */
/** One of pip's version specifiers: an operator, then a version ("==1.2", "!=1!2.0", "===x"). */
export const PIP_SPECIFIER = String.raw`(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+`;
/**
 * Specifiers separated by commas. Each is anchored at its operator and a
 * version holds no comma, so matching takes linear time (a tenant's text, on
 * the thread that serves every caller: no pattern that can backtrack
 * exponentially, as `(op? version+)+` over "!!!!…#" did).
 */
const PIP_VERSION = new RegExp(String.raw`^\s*${PIP_SPECIFIER}(?:\s*,\s*${PIP_SPECIFIER})*\s*,?\s*$`);
const BARE_VERSION = /^[A-Za-z0-9][A-Za-z0-9.*+!_-]{0,100}$/;
const NPM_VERSION = /^[A-Za-z0-9.*+^~<>=|_ -]{1,100}$/;

/** Keys that skiff reads, per table. */
const DEPLOYMENT_KEYS = ["name", "python_version", "include", "exclude", "shell_commands", "pre_build_commands"];
/** Keys of that platform that skiff ignores, per table, with why. */
const DEPLOYMENT_IGNORED: Record<string, string> = {
  docker_base_image_url: "replicas run on this machine's own system, not in a base image",
  disable_auth: "every call to skiff needs a token",
  use_uv: "dependencies are installed with pip",
  deployment_initialization_timeout: "skiff bounds a build by its own settings",
  disable_build_logs: "build output always goes to the app's log",
  disable_predict: "there is no predict step",
  disable_confirmation: "skiff deploy never asks",
  log_level: "the app's logs are kept as it writes them",
  roll_out_duration_seconds: "a new version replaces the old one as its replicas start",
  dockerfile: "skiff does not build images",
  dockerfile_path: "skiff does not build images",
};
const CUSTOM_KEYS = ["entrypoint", "port", "healthcheck_endpoint", "readycheck_endpoint", "dockerfile_path"];
const HARDWARE_KEYS = ["cpu", "memory"];
const HARDWARE_IGNORED = ["compute", "gpu_count", "gpu", "gpu_type", "provider", "region"];
const SCALING_KEYS = ["min_replicas", "max_replicas", "cooldown", "replica_concurrency", "response_grace_period"];
const DEPENDENCY_TABLES = ["pip", "npm", "apt", "conda", "paths"];
const PATHS_KEYS = ["pip", "npm", "apt", "conda"];

export interface ParsedConfig {
  config: AppConfig;
  /** What the file asks for that skiff ignores, each "file:line: key ...". */
  warnings: string[];
}

export interface CerebriumOptions {
  /** The machine's python3 version ("3.11.2"): a python_version of another minor version is a warning. */
  machinePython?: string;
}

class CerebriumChecker extends Checker {
  readonly warnings: { line: number; message: string }[] = [];
  /** The keys and tables skiff does not know: with a refusal, they are most likely why (a misspelt name). */
  readonly strangers: { key: string; line: number; message: string }[] = [];

  warn(key: string, message: string): void {
    this.warnings.push({ line: this.lineOf(key), message: `${key} ${message}` });
  }

  /** A key or table skiff does not know (`name` in `table`), named with the known one it is closest to. */
  stranger(table: string, name: string, known: readonly string[], what: "key" | "table"): void {
    // A quoted key may hold anything (a line end, a terminal's escape): said as a JSON string, cut.
    const shown = /^[A-Za-z0-9_-]{1,200}$/.test(name) ? name : JSON.stringify(name.slice(0, 200));
    const key = table === "" ? shown : `${table}.${shown}`;
    const line = this.lineOf(table === "" ? name : `${table}.${name}`);
    // A file of many unknown keys is many warnings, counted past MAX_WARNINGS: the names' comparisons stop there.
    const near = this.strangers.length < MAX_WARNINGS ? closest(name, known) : undefined;
    const hint = near
      ? ` (did you mean ${table === "" ? near : `${table}.${near}`}?)`
      : table === ""
        ? " (its tables are under [cerebrium])"
        : "";
    const message = `${key} is not a ${what} skiff knows${hint}; it is ignored`;
    this.warnings.push({ line, message });
    if (this.strangers.length < MAX_WARNINGS) this.strangers.push({ key, line, message });
  }

  /** A number (integer or not) in [min, max], or undefined. */
  number(t: Table, table: string, name: string, min: number, max: number): number | undefined {
    const v = t[name];
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isFinite(v))
      return this.fail(`${table}.${name}`, `must be a number, got ${describe(v)}`);
    if (v < min || v > max) return this.fail(`${table}.${name}`, `must be between ${min} and ${max}, got ${v}`);
    return v;
  }

  /** An array of strings (empty strings dropped), or undefined when absent. */
  strings(t: Table, table: string, name: string): string[] | undefined {
    const v = t[name];
    if (v === undefined) return undefined;
    if (!Array.isArray(v) || !v.every((s) => typeof s === "string"))
      return this.fail(`${table}.${name}`, `must be an array of strings, got ${describe(v)}`);
    if (v.length > MAX_ITEMS) return this.fail(`${table}.${name}`, `must have at most ${MAX_ITEMS} items`);
    // A command's text becomes an argument of a process: no NUL byte (the sandbox would refuse it at run time).
    if ((v as string[]).some((s) => s.includes("\0")))
      return this.fail(`${table}.${name}`, "must not contain a NUL byte");
    return (v as string[]).filter((s) => s.trim() !== "");
  }

  /** A sub-table, or an empty one; a value that is not a table is an error. */
  sub(t: Table, table: string, name: string): Table | undefined {
    const v = t[name];
    if (v === undefined) return undefined;
    if (!isTable(v)) {
      this.fail(`${table}.${name}`, `must be a table, got ${describe(v)}`);
      return undefined;
    }
    return v;
  }

  /** Keys that are neither read nor known: a warning each, never an error. */
  unknown(t: Table, table: string, known: readonly string[]): void {
    for (const k of Object.keys(t)) if (!known.includes(k)) this.stranger(table, k, known, "key");
  }
}

/** The name of `known` at most two edits from `name` (and nearer than its length), if one is. */
function closest(name: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Math.min(3, Math.ceil(name.length / 2));
  if (name.length > 64) return undefined;
  for (const k of known) {
    if (Math.abs(k.length - name.length) >= bestDistance) continue;
    const d = editDistance(name.toLowerCase(), k.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [k, d];
  }
  return best;
}

/** A relative path inside the app folder, with forward slashes, or undefined after an error. */
function relativePath(c: Checker, key: string, value: string): string | undefined {
  const normal = path.posix.normalize(value.replaceAll("\\", "/"));
  if (
    value === "" ||
    value.includes("\0") ||
    path.posix.isAbsolute(normal) ||
    normal === ".." ||
    normal.startsWith("../")
  )
    return c.fail(key, `must be a relative path inside the app folder, got ${JSON.stringify(value)}`);
  return normal;
}

function checkDeployment(c: CerebriumChecker, t: Table, opts: CerebriumOptions) {
  const table = "cerebrium.deployment";
  c.unknown(t, table, [...DEPLOYMENT_KEYS, ...Object.keys(DEPLOYMENT_IGNORED)]);
  for (const [k, why] of Object.entries(DEPLOYMENT_IGNORED))
    // disable_auth = false and use_uv = false ask for what skiff does anyway.
    if (t[k] !== undefined && t[k] !== false && k !== "dockerfile" && k !== "dockerfile_path")
      c.warn(`${table}.${k}`, `is ignored: ${why}`);
  let name = c.string(t, table, "name");
  if (name === undefined && t.name === undefined) c.fail(`${table}.name`, "is required");
  if (name !== undefined && !APP_NAME_PATTERN.test(name))
    name = c.fail(`${table}.name`, `must be ${APP_NAME_RULE}, got ${JSON.stringify(name)}`);
  const python = c.string(t, table, "python_version");
  if (python !== undefined) {
    const want = /^(\d+)\.(\d+)(?:\.\d+)?$/.exec(python.trim());
    const have = opts.machinePython && /^(\d+)\.(\d+)/.exec(opts.machinePython);
    if (!want) c.fail(`${table}.python_version`, `must be a version such as "3.11", got ${JSON.stringify(python)}`);
    else if (have && (want[1] !== have[1] || want[2] !== have[2]))
      c.warn(
        `${table}.python_version`,
        `asks for Python ${python}; this machine serves the app with its own Python ${opts.machinePython}`,
      );
  }
  // The globs are matched against every file of the bundle on the thread that serves every caller: each path
  // costs at most its length times the globs' characters (bundle.ts), so those are bounded.
  const globs = (key: string) => {
    const list = c.strings(t, table, key);
    if (list && list.reduce((n, g) => n + g.length, 0) > MAX_GLOB_CHARS)
      return c.fail(`${table}.${key}`, `must have at most ${MAX_GLOB_CHARS} characters in all`);
    return list?.map((g) => g.replace(/^(\.\/)+/, ""));
  };
  const include = globs("include") ?? DEFAULT_INCLUDE;
  const exclude = globs("exclude") ?? DEFAULT_EXCLUDE;
  const shellCommands = c.strings(t, table, "shell_commands") ?? [];
  const preBuildCommands = c.strings(t, table, "pre_build_commands") ?? [];
  return { name, include, exclude, shellCommands, preBuildCommands, dockerfile: t.dockerfile ?? t.dockerfile_path };
}

function checkPath(c: Checker, t: Table, table: string, name: string): string | undefined {
  const v = c.string(t, table, name);
  if (v === "") return undefined; // written empty: not set
  if (v !== undefined && !/^\/[\x21-\x7e]*$/.test(v))
    return c.fail(`${table}.${name}`, `must be a URL path starting with "/", got ${JSON.stringify(v)}`);
  return v;
}

/** A command line as a string, split into words the way a shell would without running one: quotes and backslashes only. */
export function splitCommandLine(line: string): string[] | undefined {
  const words: string[] = [];
  let word: string | undefined;
  let quote: '"' | "'" | undefined;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i];
    if (quote) {
      if (ch === quote) quote = undefined;
      else if (ch === "\\" && quote === '"' && i + 1 < line.length && '"\\$`'.includes(line[i + 1]))
        word = (word ?? "") + line[++i];
      else word = (word ?? "") + ch;
    } else if (ch === "'" || ch === '"') {
      quote = ch;
      word ??= "";
    } else if (ch === "\\" && i + 1 < line.length) word = (word ?? "") + line[++i];
    else if (/\s/.test(ch)) {
      if (word !== undefined) words.push(word);
      word = undefined;
    } else word = (word ?? "") + ch;
  }
  if (quote) return undefined;
  if (word !== undefined) words.push(word);
  return words;
}

function checkCustom(c: CerebriumChecker, t: Table, dockerfile: unknown): CustomRuntime | undefined {
  const table = "cerebrium.runtime.custom";
  c.unknown(t, table, CUSTOM_KEYS);
  const raw = t.entrypoint;
  let command: string[] | undefined;
  if (raw === undefined) {
    if (dockerfile !== undefined || t.dockerfile_path !== undefined)
      c.fail(
        `${table}.entrypoint`,
        "is required: skiff does not build the Dockerfile, so it needs the command that starts the server",
      );
    else c.fail(`${table}.entrypoint`, 'is required for a custom runtime, e.g. ["uvicorn", "main:app"]');
  } else if (typeof raw === "string") {
    command = splitCommandLine(raw);
    if (!command || command.length === 0)
      command = c.fail(`${table}.entrypoint`, `must be a command line, got ${JSON.stringify(raw)}`);
  } else if (Array.isArray(raw) && raw.length > 0 && raw.every((a) => typeof a === "string") && raw[0] !== "")
    command = raw as string[];
  else
    c.fail(
      `${table}.entrypoint`,
      `must be a non-empty array of strings (or a command line) whose first item names the program, got ${describe(raw)}`,
    );
  if (command?.some((a) => a.includes("\0"))) command = c.fail(`${table}.entrypoint`, "must not contain a NUL byte");
  if (t.dockerfile_path !== undefined && command)
    c.warn(`${table}.dockerfile_path`, "is ignored: skiff does not build images; the entrypoint runs on this machine");
  if (dockerfile !== undefined && command)
    c.warn(
      "cerebrium.deployment.dockerfile",
      "is ignored: skiff does not build images; the entrypoint runs on this machine",
    );
  const port = t.port === undefined ? undefined : c.integer(t, table, "port", 0, 1, 65535);
  const healthcheck = checkPath(c, t, table, "healthcheck_endpoint");
  const readycheck = checkPath(c, t, table, "readycheck_endpoint");
  if (!command) return undefined;
  const runtime: CustomRuntime = {
    kind: "custom",
    command,
    healthcheck: healthcheck ?? readycheck ?? DEFAULT_HEALTHCHECK,
  };
  if (readycheck !== undefined) runtime.readycheck = readycheck;
  if (port !== undefined) runtime.port = port;
  return runtime;
}

function checkRuntime(
  c: CerebriumChecker,
  t: Table | undefined,
  dockerfile: unknown,
): AppConfig["runtime"] | undefined {
  const cortex = { kind: "cortex", language: "python", entry: CORTEX_ENTRY } as const;
  if (t === undefined) {
    // Without an image, what can run is the folder's main.py (checked to exist when the folder is read).
    if (dockerfile !== undefined)
      c.warn(
        "cerebrium.deployment.dockerfile",
        "is ignored: skiff does not build images; the app runs as a Cortex app with its main.py",
      );
    return { ...cortex };
  }
  const kinds = Object.keys(t);
  for (const k of kinds)
    if (k !== "custom" && k !== "cortex")
      c.fail(`cerebrium.runtime.${k}`, 'is not a runtime skiff runs: use [cerebrium.runtime.custom] or "cortex"');
  if (kinds.includes("custom") && kinds.includes("cortex"))
    return c.fail("cerebrium.runtime", "must name one runtime: custom or cortex, not both");
  if (kinds.includes("custom")) {
    const custom = c.sub(t, "cerebrium.runtime", "custom");
    return custom ? checkCustom(c, custom, dockerfile) : undefined;
  }
  const table = c.sub(t, "cerebrium.runtime", "cortex");
  if (table) c.unknown(table, "cerebrium.runtime.cortex", []);
  return { ...cortex };
}

function checkHardware(c: CerebriumChecker, t: Table): AppConfig["resources"] {
  const table = "cerebrium.hardware";
  c.unknown(t, table, [...HARDWARE_KEYS, ...HARDWARE_IGNORED]);
  // A CPU-only request (compute = "CPU", gpu_count = 0) is what skiff gives: nothing to warn about.
  const cpuOnly = (k: string) =>
    (k === "compute" && typeof t[k] === "string" && (t[k] as string).toUpperCase() === "CPU") ||
    (k === "gpu_count" && t[k] === 0);
  const ignored = HARDWARE_IGNORED.filter((k) => t[k] !== undefined && !cpuOnly(k));
  if (ignored.length > 0)
    c.warn(
      `${table}.${ignored[0]}`,
      `${ignored.length > 1 ? `(and ${ignored.slice(1).join(", ")}) are` : "is"} ignored: replicas run on this machine's CPUs, without a GPU`,
    );
  const cpu = c.number(t, table, "cpu", 0.01, MAX_CPU);
  const memory = c.number(t, table, "memory", 0.01, MAX_MEMORY_GB);
  const resources: NonNullable<AppConfig["resources"]> = {};
  if (cpu !== undefined) resources.cpu = cpu;
  if (memory !== undefined) resources.memoryMb = Math.max(1, Math.round(memory * 1024));
  return Object.keys(resources).length > 0 ? resources : undefined;
}

/** [cerebrium.scaling], as skiff.toml's [scaling] with that platform's spellings; other keys warn. */
function checkCerebriumScaling(c: CerebriumChecker, t: Table): Scaling | undefined {
  const table = "cerebrium.scaling";
  c.unknown(t, table, SCALING_KEYS);
  // A cooldown of 0 there means "stop at once": the shortest skiff has is 1 second.
  if (t.cooldown === 0) {
    c.warn(`${table}.cooldown`, "of 0 is taken as 1 second, the shortest skiff has");
    t = { ...t, cooldown: 1 };
  }
  return checkScaling(c, t, table);
}

function requirement(c: Checker, key: string, name: string, version: unknown, kind: "pip" | "npm"): string | undefined {
  if (!(kind === "pip" ? PIP_NAME : PACKAGE_NAME).test(name)) return c.fail(key, `is not a package name`);
  if (typeof version !== "string")
    return c.fail(key, `must be a version string ("latest", "1.2.3", ">=1.0"), got ${describe(version)}`);
  const v = version.trim();
  if (v === "" || v === "latest" || v === "*") return name;
  if (kind === "npm")
    return NPM_VERSION.test(v) ? `${name}@${v}` : c.fail(key, `is not a version npm reads: ${JSON.stringify(version)}`);
  if (PIP_VERSION.test(v)) return `${name}${v.replace(/\s+/g, "")}`;
  if (BARE_VERSION.test(v)) return `${name}==${v}`;
  return c.fail(key, `is not a version pip reads: ${JSON.stringify(version)}`);
}

/** A table of packages (name = version) or, for apt and conda, also an array of names. */
function packages(c: CerebriumChecker, deps: Table, kind: "pip" | "npm" | "apt" | "conda"): string[] {
  const table = `cerebrium.dependencies.${kind}`;
  const v = deps[kind];
  if (v === undefined) return [];
  const out: string[] = [];
  if (Array.isArray(v) && (kind === "apt" || kind === "conda")) {
    if (v.length > MAX_ITEMS) {
      c.fail(table, `must have at most ${MAX_ITEMS} packages`);
      return [];
    }
    for (const n of v)
      if (typeof n !== "string" || !PACKAGE_NAME.test(n)) c.fail(table, `must list package names, got ${describe(n)}`);
      else out.push(n);
    return out;
  }
  if (!isTable(v)) {
    c.fail(table, `must be a table of package = "version", got ${describe(v)}`);
    return [];
  }
  const entries = Object.entries(v);
  if (entries.length > MAX_ITEMS) {
    c.fail(table, `must have at most ${MAX_ITEMS} packages`);
    return [];
  }
  for (const [name, version] of entries) {
    const key = `${table}.${name}`;
    if (kind === "apt" || kind === "conda") {
      if (!PACKAGE_NAME.test(name)) c.fail(key, "is not a package name");
      else if (typeof version !== "string") c.fail(key, `must be a version string, got ${describe(version)}`);
      else {
        if (version.trim() !== "" && version.trim() !== "latest")
          c.warn(key, `asks for version ${JSON.stringify(version)}: the machine's installed version is used`);
        out.push(name);
      }
      continue;
    }
    const r = requirement(c, key, name, version, kind);
    if (r !== undefined) out.push(r);
  }
  return out;
}

function checkDependencies(
  c: CerebriumChecker,
  t: Table,
): { build: Omit<AppBuild, "shellCommands" | "preBuildCommands">; files: Record<string, string> } {
  const table = "cerebrium.dependencies";
  c.unknown(t, table, DEPENDENCY_TABLES);
  const files: Record<string, string> = {};
  const paths = c.sub(t, table, "paths");
  if (paths) {
    c.unknown(paths, `${table}.paths`, PATHS_KEYS);
    for (const k of PATHS_KEYS) {
      const v = c.string(paths, `${table}.paths`, k);
      if (v === undefined || v.trim() === "") continue;
      const rel = relativePath(c, `${table}.paths.${k}`, v.trim());
      if (rel !== undefined) files[k] = rel;
    }
  }
  return {
    build: {
      pip: packages(c, t, "pip"),
      pipFiles: files.pip ? [files.pip] : [],
      aptFiles: files.apt ? [files.apt] : [],
      condaFiles: files.conda ? [files.conda] : [],
      npm: packages(c, t, "npm"),
      apt: packages(c, t, "apt"),
      conda: packages(c, t, "conda"),
    },
    files,
  };
}

/**
 * Parses and validates a cerebrium.toml. Throws AppConfigError listing every
 * problem; returns the config and the warnings ("cerebrium.toml:3: ...").
 * The lists of apt/conda packages and paths.apt/paths.conda are checked
 * against the machine when the deployment is prepared (prepare.ts).
 */
export function parseCerebriumConfig(
  text: string,
  opts: CerebriumOptions = {},
  file = CEREBRIUM_CONFIG_FILE,
): ParsedConfig {
  const doc = parseToml(text, file);
  const c = new CerebriumChecker(keyLines(text));
  for (const k of Object.keys(doc)) if (k !== "cerebrium") c.stranger("", k, ["cerebrium"], "table");
  const root = c.sub(doc, "", "cerebrium") ?? (Object.create(null) as Table);
  if (doc.cerebrium === undefined) c.fail("cerebrium", 'is required: [cerebrium.deployment] with name = "..."');
  const tables = ["deployment", "runtime", "hardware", "scaling", "dependencies"];
  for (const k of Object.keys(root)) if (!tables.includes(k)) c.stranger("cerebrium", k, tables, "table");
  const deploymentTable = c.sub(root, "cerebrium", "deployment");
  if (deploymentTable === undefined && root.deployment === undefined)
    c.fail("cerebrium.deployment", 'is required: [cerebrium.deployment] with name = "..."');
  const deployment = checkDeployment(c, deploymentTable ?? (Object.create(null) as Table), opts);
  const runtime = checkRuntime(c, c.sub(root, "cerebrium", "runtime"), deployment.dockerfile);
  const hardware = c.sub(root, "cerebrium", "hardware");
  const resources = hardware ? checkHardware(c, hardware) : undefined;
  const scalingTable = c.sub(root, "cerebrium", "scaling") ?? (Object.create(null) as Table);
  const scaling = checkCerebriumScaling(c, scalingTable);
  const deps = checkDependencies(c, c.sub(root, "cerebrium", "dependencies") ?? (Object.create(null) as Table));
  if (deps.files.npm !== undefined && deps.files.npm !== "package.json")
    c.warn("cerebrium.dependencies.paths.npm", "is ignored: npm installs from the folder's package.json");
  if (c.issues.length > 0 || deployment.name === undefined || runtime === undefined || scaling === undefined)
    // What skiff did not know goes with the refusal: a misspelt name is the usual reason a required one is missing.
    throw new AppConfigError(
      file,
      [...c.issues, ...c.strangers].sort((a, b) => a.line - b.line),
    );
  const config: AppConfig = {
    app: { name: deployment.name },
    runtime,
    env: Object.create(null) as Record<string, string>,
    scaling,
    source: CEREBRIUM_CONFIG_FILE,
    build: {
      preBuildCommands: deployment.preBuildCommands,
      shellCommands: deployment.shellCommands,
      ...deps.build,
    },
    files: { include: deployment.include, exclude: deployment.exclude },
  };
  if (resources) config.resources = resources;
  const sorted = c.warnings.sort((a, b) => a.line - b.line);
  // Each warning is a line of the app's log and of the deploy's answer: a file of 100,000 unknown keys is not
  // 100,000 lines.
  const warnings = sorted.slice(0, MAX_WARNINGS).map((w) => `${file}:${w.line}: ${w.message.slice(0, 1000)}`);
  if (sorted.length > MAX_WARNINGS)
    warnings.push(`${file}: ${sorted.length - MAX_WARNINGS} more warnings of keys skiff ignores are not shown`);
  return { config, warnings };
}
