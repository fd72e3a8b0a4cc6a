// An app folder's configuration file, whichever it has: skiff.toml or
// cerebrium.toml (one per folder; both is an error naming both), read into
// one AppConfig with the warnings of what it asks that skiff ignores; and
// the removal of the files a cerebrium.toml's include/exclude globs leave
// out (bundle.ts's fileSelection, which `skiff deploy` applies when it
// packs), so that a bundle sent through the API obeys them too.
import { execFileSync } from "node:child_process";
import { lstat, readdir, readFile, rm, stat } from "node:fs/promises";
import path from "node:path";
import { AppConfigError, keyLines, parseAppConfig, type AppConfig } from "./app-config.js";
import { parseCerebriumConfig, type ParsedConfig } from "./cerebrium-config.js";
import { APP_CONFIG_FILE, CEREBRIUM_CONFIG_FILE, CONFIG_FILES, type ConfigFileName, fileSelection } from "./bundle.js";

/** Largest configuration file read. */
const MAX_CONFIG_BYTES = 1024 * 1024;

let machinePython: string | undefined | null = null;

/** The version of the python3 on the replica PATH ("3.11.2"), once per process; undefined without one. */
function machinePythonVersion(): string | undefined {
  if (machinePython === null) {
    machinePython = undefined;
    for (const p of ["/usr/local/bin/python3", "/usr/bin/python3", "/bin/python3"]) {
      try {
        const out = execFileSync(p, ["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], {
          encoding: "utf8",
          env: {},
          timeout: 10_000,
          stdio: ["ignore", "pipe", "ignore"],
        });
        machinePython = out.trim();
        break;
      } catch {
        // not this one
      }
    }
  }
  return machinePython;
}

/** Parses a configuration file's text by its name. Throws AppConfigError. */
export function parseConfigFile(text: string, file: ConfigFileName): ParsedConfig {
  if (file === CEREBRIUM_CONFIG_FILE) return parseCerebriumConfig(text, { machinePython: machinePythonVersion() });
  return { config: parseAppConfig(text, file), warnings: [] };
}

/** Which configuration files are at the root of `dir` as plain files (a link or folder of that name counts too). */
async function configFilesIn(dir: string): Promise<ConfigFileName[]> {
  const found: ConfigFileName[] = [];
  for (const name of CONFIG_FILES)
    if (
      await lstat(path.join(dir, name)).then(
        () => true,
        () => false,
      )
    )
      found.push(name);
  return found;
}

/** The one configuration file of an app folder; throws AppConfigError when it has none or both. */
export async function configFileOf(dir: string): Promise<ConfigFileName> {
  const found = await configFilesIn(dir);
  if (found.length === 1) return found[0];
  if (found.length === 0)
    throw new AppConfigError(APP_CONFIG_FILE, [
      { key: "", line: 1, message: `${dir} has no ${APP_CONFIG_FILE} or ${CEREBRIUM_CONFIG_FILE} at its root` },
    ]);
  throw new AppConfigError(found.join(" and "), [
    {
      key: "",
      line: 1,
      message: `an app folder has one configuration file, and this one has both ${APP_CONFIG_FILE} and ${CEREBRIUM_CONFIG_FILE}: remove one`,
    },
  ]);
}

interface ReadConfig extends ParsedConfig {
  file: ConfigFileName;
  /** The file's text as read. */
  text: string;
}

/**
 * Reads and validates the configuration file of `dir` (skiff.toml or
 * cerebrium.toml), and checks that a Cortex entry exists in the folder.
 * Throws AppConfigError.
 */
export async function readAppConfig(dir: string): Promise<ReadConfig> {
  const file = await configFileOf(dir);
  const full = path.join(dir, file);
  let text: string;
  try {
    const st = await lstat(full);
    if (!st.isFile()) throw new Error("not a file");
    if (st.size > MAX_CONFIG_BYTES) throw new Error(`larger than ${MAX_CONFIG_BYTES} bytes`);
    text = await readFile(full, "utf8");
  } catch (err) {
    throw new AppConfigError(file, [{ key: "", line: 1, message: `cannot read ${full}: ${(err as Error).message}` }], {
      cause: err,
    });
  }
  const parsed = parseConfigFile(text, file);
  const { runtime } = parsed.config;
  if (runtime.kind === "cortex") {
    const found = await stat(path.join(dir, runtime.entry)).then(
      (s) => s.isFile(),
      () => false,
    );
    if (!found) {
      const key = file === CEREBRIUM_CONFIG_FILE ? "cerebrium.runtime" : "runtime.entry";
      const line = keyLines(text).get(key) ?? 1;
      throw new AppConfigError(file, [
        {
          key,
          line,
          message:
            file === CEREBRIUM_CONFIG_FILE
              ? `the app has no [cerebrium.runtime.custom] entrypoint, so it is a Cortex app, and ${runtime.entry} is not in the app folder (skiff builds no Dockerfile or image)`
              : `runtime.entry names a file that is not in the app folder: "${runtime.entry}"`,
        },
      ]);
    }
  }
  return { ...parsed, file, text };
}

/** Positions the globs of one bundle may try in all (GlobBudget): seconds of CPU at most, never minutes. */
const GLOB_STEPS = 200_000_000;
/** Steps of matching between two turns given to the rest of the process. */
const STEPS_PER_TURN = 5_000_000;

/**
 * Removes from an unpacked folder the files and links the config's globs
 * leave out (links are removed, never followed). Returns how many. The
 * tenant's globs run on the thread that serves every caller: they are
 * matched in turns, within GLOB_STEPS, past which the bundle is refused
 * (BundleError).
 */
export async function removeUnselected(dir: string, config: Pick<AppConfig, "files">): Promise<number> {
  if (!config.files) return 0;
  const budget = { steps: GLOB_STEPS };
  const selected = fileSelection(config.files, budget);
  let removed = 0;
  let turn = GLOB_STEPS;
  const walk = async (rel: string): Promise<void> => {
    for (const e of await readdir(path.join(dir, rel), { withFileTypes: true })) {
      if (turn - budget.steps >= STEPS_PER_TURN) {
        turn = budget.steps;
        await new Promise((resolve) => setImmediate(resolve));
      }
      const p = rel === "" ? e.name : `${rel}/${e.name}`;
      if (e.isDirectory() && !e.isSymbolicLink()) await walk(p);
      else if (!selected(p)) {
        await rm(path.join(dir, p), { force: true });
        removed++;
      }
    }
  };
  await walk("");
  return removed;
}
