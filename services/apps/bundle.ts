// App bundles: the gzipped tar of an app folder that `skiff deploy` uploads
// and runners unpack.
//
// packApp() takes every file of the folder except what `.gitignore` or
// `.skiffignore` at its root exclude, and what a cerebrium.toml's
// include/exclude globs leave out (config-file.ts), and always leaves out
// `.git`, `node_modules` and `.skiff` (dependencies are installed per
// deployment).
// Files are sorted and stamped with one fixed mtime, so the same folder
// makes the same bytes and the same digest (runners cache by digest).
//
// unpackBundle() reads the whole bundle before writing anything and refuses
// it when any entry is an absolute path, has a `..` segment, lies below a
// link or a file, is under `.skiff/` (skiff's own), or is not a plain file,
// folder or link (devices, FIFOs); when a link's target points out of the
// folder or passes through another link (so `d -> .` then `e -> d/d/../..`
// cannot climb out, whatever the text of the path says) or the link's path
// and target lie one inside the other; when a hard link names anything but
// a file earlier in the bundle; when it has more entries
// than SKIFF_MAX_BUNDLE_FILES; when the gzip bytes or the tar inside exceed
// the limit (SKIFF_MAX_BUNDLE_BYTES); or when it has not one configuration file
// (`skiff.toml` or `cerebrium.toml`) as a file at its root. Once written, every symbolic link is resolved by the file system
// and must land on a file or folder inside the app folder; otherwise the
// folder is removed and the bundle refused. After an error it returns only
// once the unpacker has stopped writing.
import { createHash } from "node:crypto";
import { lstat, mkdir, readdir, readFile, readlink, realpath, rm } from "node:fs/promises";
import path from "node:path";
import { gunzipSync } from "node:zlib";
import ignore, { type Ignore } from "ignore";
import { Parser, x as extract, c as create, type ReadEntry } from "tar";
import { parse as parseToml } from "smol-toml";

/** skiff's own configuration file, at an app folder's (and its bundle's) root. */
export const APP_CONFIG_FILE = "skiff.toml";
/** The configuration file of apps written for the platform the spec documents (docs/migrating.md). */
export const CEREBRIUM_CONFIG_FILE = "cerebrium.toml";
/** Every name an app's configuration file may have; a folder has one. */
export const CONFIG_FILES = [APP_CONFIG_FILE, CEREBRIUM_CONFIG_FILE] as const;
export type ConfigFileName = (typeof CONFIG_FILES)[number];
/** Which files the bundle holds when a cerebrium.toml does not say (that platform's defaults). */
export const DEFAULT_INCLUDE = ["*"];
export const DEFAULT_EXCLUDE = [".*"];

/** One character of a glob ("?", a class, a literal) or a "*" (any text, slashes too, empty too). */
type GlobToken = { star: true } | { star: false; test: (ch: string) => boolean };

/**
 * A glob of Python's fnmatch: `*` matches any text (slashes too), `?` one
 * character, `[...]` a class (`[!...]` its complement; a range out of order
 * matches nothing). Matched by globMatches() below, never as a RegExp: a
 * tenant's glob with many stars would make a backtracking match take
 * exponential time on the thread that serves every tenant.
 */
function compileGlob(glob: string): GlobToken[] {
  const tokens: GlobToken[] = [];
  for (let i = 0; i < glob.length; i++) {
    const ch = glob[i];
    if (ch === "*") {
      if (!tokens.at(-1)?.star) tokens.push({ star: true });
    } else if (ch === "?") tokens.push({ star: false, test: () => true });
    else if (ch === "[" && glob.indexOf("]", i + 2) !== -1) {
      const end = glob.indexOf("]", i + 2);
      let body = glob.slice(i + 1, end);
      const negate = body.startsWith("!");
      if (negate) body = body.slice(1);
      const ranges: [number, number][] = [];
      for (let j = 0; j < body.length; j++) {
        if (j + 2 < body.length && body[j + 1] === "-") {
          ranges.push([body.charCodeAt(j), body.charCodeAt(j + 2)]);
          j += 2;
        } else ranges.push([body.charCodeAt(j), body.charCodeAt(j)]);
      }
      tokens.push({
        star: false,
        test: (c) => {
          const x = c.charCodeAt(0);
          return ranges.some(([lo, hi]) => lo <= x && x <= hi) !== negate;
        },
      });
      i = end;
    } else tokens.push({ star: false, test: (c) => c === ch });
  }
  return tokens;
}

/** Work left for matching globs (positions tried); none left: the match stops with a BundleError. */
export interface GlobBudget {
  steps: number;
}

/**
 * Whether a glob matches a path or one of its folders ("src" selects
 * "src/a.py", as "src/" does): one pass over the path with the set of the
 * glob's positions reached so far (a Thompson NFA), so its time is at most
 * the path's length times the glob's.
 */
function globMatches(tokens: GlobToken[], rel: string, budget: GlobBudget | undefined): boolean {
  const m = tokens.length;
  const mark = new Int32Array(m + 1).fill(-1);
  let gen = 0;
  // Adds a position and, past a star (which may match nothing), the ones after it.
  const add = (list: number[], from: number) => {
    for (let p = from; p <= m && mark[p] !== gen; p++) {
      mark[p] = gen;
      list.push(p);
      if (p === m || !tokens[p].star) break;
    }
  };
  let cur: number[] = [];
  add(cur, 0);
  for (let i = 0; ; i++) {
    // The text so far is the whole path, a folder of it, or a folder with its "/".
    if (mark[m] === gen && (i === rel.length || rel[i] === "/" || (i > 0 && rel[i - 1] === "/"))) return true;
    if (i === rel.length || cur.length === 0) return false;
    if (budget && (budget.steps -= cur.length) < 0)
      throw new BundleError(
        "invalid",
        `${CEREBRIUM_CONFIG_FILE}: the include/exclude globs take too long to match the bundle's files; make them simpler`,
      );
    gen++;
    const next: number[] = [];
    const c = rel[i];
    for (const p of cur) {
      if (p === m) continue;
      const t = tokens[p];
      if (t.star) add(next, p);
      else if (t.test(c)) add(next, p + 1);
    }
    cur = next;
  }
}

/** Whether a glob matches a path or one of its folders ("src" selects "src/a.py"). */
function matchesAny(globs: GlobToken[][], rel: string, budget: GlobBudget | undefined): boolean {
  return globs.some((g) => globMatches(g, rel, budget));
}

/**
 * The selection that a cerebrium.toml's include/exclude globs make (paths
 * relative to the folder, "/"-separated, a leading "./" dropped): whether a
 * file is in the bundle. The configuration files always are; without globs,
 * every file is. With a budget, matching past it throws BundleError.
 */
export function fileSelection(
  files: { include: string[]; exclude: string[] } | undefined,
  budget?: GlobBudget,
): (rel: string) => boolean {
  if (!files) return () => true;
  const compile = (globs: string[]) => globs.map((g) => compileGlob(g.replace(/^(\.\/)+/, "")));
  const [include, exclude] = [compile(files.include), compile(files.exclude)];
  return (rel) =>
    (CONFIG_FILES as readonly string[]).includes(rel) ||
    (matchesAny(include, rel, budget) && !matchesAny(exclude, rel, budget));
}

/**
 * The include/exclude globs of a cerebrium.toml, as packing needs them (the
 * server validates the whole file when it deploys). Throws BundleError.
 */
function cerebriumGlobs(text: string): { include: string[]; exclude: string[] } {
  let deployment: unknown;
  try {
    deployment = (parseToml(text) as { cerebrium?: { deployment?: unknown } }).cerebrium?.deployment;
  } catch (err) {
    throw new BundleError("invalid", `${CEREBRIUM_CONFIG_FILE}: ${(err as Error).message.split("\n")[0]}`, {
      cause: err,
    });
  }
  const d = (typeof deployment === "object" && deployment !== null ? deployment : {}) as Record<string, unknown>;
  const list = (key: string, fallback: string[]): string[] => {
    const v = d[key];
    if (v === undefined) return fallback;
    if (!Array.isArray(v) || !v.every((g) => typeof g === "string"))
      throw new BundleError(
        "invalid",
        `${CEREBRIUM_CONFIG_FILE}: cerebrium.deployment.${key} must be an array of strings`,
      );
    return (v as string[]).filter((g) => g.trim() !== "");
  };
  return { include: list("include", DEFAULT_INCLUDE), exclude: list("exclude", DEFAULT_EXCLUDE) };
}

/** Never packed, whatever the ignore files say. */
const ALWAYS_EXCLUDED = [".git", "node_modules", ".skiff"];
const IGNORE_FILES = [".gitignore", ".skiffignore"];
/** Most entries in a bundle when the caller names no limit (SKIFF_MAX_BUNDLE_FILES). */
const DEFAULT_MAX_BUNDLE_FILES = 20_000;
/** The bundle limits of this process, set once at start from the configuration. */
/** A folder of the app that skiff writes (dependencies' venv, its marker); never in a bundle. */
const RESERVED = ".skiff";
/** Stamped on every packed entry so that packing is reproducible. */
const FIXED_MTIME = new Date("2000-01-01T00:00:00Z");
const GZIP_MAGIC = [0x1f, 0x8b];

export class BundleError extends Error {
  override name = "BundleError";
  constructor(
    /** "too_large": over the byte limit; "invalid": anything else wrong with it. */
    readonly reason: "too_large" | "invalid",
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

interface PackedApp {
  /** The gzipped tar. */
  bytes: Buffer;
  /** Paths in the bundle, "/"-separated, sorted. */
  files: string[];
}

export const sha256 = (bytes: Uint8Array): string => createHash("sha256").update(bytes).digest("hex");

async function ignoreRules(dir: string): Promise<Ignore> {
  const rules = ignore().add(ALWAYS_EXCLUDED.map((n) => `/${n}`));
  for (const name of IGNORE_FILES) {
    const text = await readFile(path.join(dir, name), "utf8").catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return "";
      throw err;
    });
    rules.add(text);
  }
  return rules;
}

/** Whether a link's target, seen from the link's folder, stays inside the root. */
function linkStaysInside(entryPath: string, target: string, hard: boolean): boolean {
  if (target === "" || path.posix.isAbsolute(target) || /^[A-Za-z]:/.test(target)) return false;
  const from = hard ? "" : path.posix.dirname(entryPath);
  const resolved = path.posix.normalize(path.posix.join(from, target));
  return resolved !== ".." && !resolved.startsWith("../");
}

/** Packs an app folder (see the header). Throws BundleError for a folder that cannot be deployed. */
export async function packApp(dir: string): Promise<PackedApp> {
  const root = path.resolve(dir);
  const found: ConfigFileName[] = [];
  for (const name of CONFIG_FILES) if (await lstat(path.join(root, name)).catch(() => undefined)) found.push(name);
  if (found.length === 0)
    throw new BundleError(
      "invalid",
      `${path.join(dir, APP_CONFIG_FILE)} not found: an app folder has ${APP_CONFIG_FILE} (or ${CEREBRIUM_CONFIG_FILE}) at its root`,
    );
  if (found.length > 1)
    throw new BundleError(
      "invalid",
      `${dir} has both ${APP_CONFIG_FILE} and ${CEREBRIUM_CONFIG_FILE}: an app folder has one configuration file, remove one`,
    );
  const configFile = found[0];
  if (!(await lstat(path.join(root, configFile))).isFile())
    throw new BundleError("invalid", `${path.join(dir, configFile)} is not a file`);
  // A cerebrium.toml's include/exclude globs choose the files.
  const selected = fileSelection(
    configFile === CEREBRIUM_CONFIG_FILE
      ? cerebriumGlobs(await readFile(path.join(root, configFile), "utf8"))
      : undefined,
  );
  const rules = await ignoreRules(root);
  const files: string[] = [];
  const walk = async (rel: string): Promise<void> => {
    for (const e of await readdir(path.join(root, rel), { withFileTypes: true })) {
      const p = rel === "" ? e.name : `${rel}/${e.name}`;
      if (rules.ignores(e.isDirectory() ? `${p}/` : p)) continue;
      if (e.isDirectory()) await walk(p);
      else if (!selected(p)) continue;
      else if (e.isSymbolicLink()) {
        const target = await readlink(path.join(root, p));
        if (!linkStaysInside(p, target, false))
          throw new BundleError(
            "invalid",
            `${p} is a link to ${target}, outside the app folder; copy what it points to into the folder`,
          );
        files.push(p);
      } else if (e.isFile()) files.push(p);
      else throw new BundleError("invalid", `${p} is neither a file, a folder nor a link`);
    }
  };
  await walk("");
  files.sort();
  const pack = create(
    { gzip: true, cwd: root, portable: true, noDirRecurse: true, follow: false, mtime: FIXED_MTIME },
    files,
  );
  const chunks: Buffer[] = [];
  for await (const chunk of pack) chunks.push(Buffer.from(chunk as Uint8Array));
  return { bytes: Buffer.concat(chunks), files };
}

const ALLOWED_TYPES = new Set(["File", "OldFile", "ContiguousFile", "Directory", "SymbolicLink", "Link"]);
const FILE_TYPES = new Set(["File", "OldFile", "ContiguousFile", "Link"]);

/**
 * Whether a link target, resolved segment by segment from the link's folder,
 * stays inside the root without passing through any other link (a link may
 * only be the last segment). Text alone cannot tell where `d/d/..` lands
 * when `d` is a link, so links through links are refused.
 */
function targetStaysInside(entryPath: string, target: string, hard: boolean, links: ReadonlySet<string>): boolean {
  if (!linkStaysInside(entryPath, target, hard)) return false;
  const from = hard
    ? []
    : path.posix
        .dirname(entryPath)
        .split("/")
        .filter((s) => s !== "" && s !== ".");
  const segments = target.split("/").filter((s) => s !== "" && s !== ".");
  const cur = [...from];
  for (let i = 0; i < segments.length; i++) {
    const seg = segments[i];
    if (seg === "..") {
      if (cur.length === 0) return false;
      cur.pop();
      continue;
    }
    cur.push(seg);
    // Hard links are made with the path as written: no link anywhere in it.
    if (links.has(cur.join("/")) && (hard || i < segments.length - 1)) return false;
  }
  return true;
}

/**
 * The unpacker (node-tar) reserves a link's path and its target's text, each
 * with its folders, under one key per path (Unicode- and case-folded); when
 * one of them is a folder of the other, it waits for itself forever. Such a
 * link (`a/a -> a`) is refused before anything is written.
 */
function wedgesUnpacker(entryPath: string, linkpath: string): boolean {
  const key = (p: string) =>
    path.posix.join(p.normalize("NFD").toLocaleLowerCase("en").toLocaleUpperCase("en")).replace(/(?<=.)\/+$/, "");
  const folders = (p: string) => {
    const out: string[] = [];
    for (let at = p.indexOf("/"); at !== -1; at = p.indexOf("/", at + 1)) out.push(at === 0 ? "/" : p.slice(0, at));
    return out;
  };
  const [a, b] = [key(entryPath), key(linkpath)];
  return folders(a).includes(b) || folders(b).includes(a);
}

/** The checks of one entry; returns its normalized path. */
function checkEntry(entry: ReadEntry, links: Set<string>): string {
  const raw = entry.path;
  const shown = JSON.stringify(raw.slice(0, 200));
  if (raw.startsWith("/") || raw.startsWith("\\") || /^[A-Za-z]:/.test(raw))
    throw new BundleError("invalid", `bundle entry ${shown} is an absolute path`);
  const segments = raw.split(/[\\/]+/).filter((s) => s !== "" && s !== ".");
  if (segments.includes("..")) throw new BundleError("invalid", `bundle entry ${shown} has a ".." segment`);
  if (!ALLOWED_TYPES.has(entry.type))
    throw new BundleError(
      "invalid",
      `bundle entry ${shown} is a ${entry.type}; only files, folders and links are allowed`,
    );
  const normal = segments.join("/");
  if (segments[0] === RESERVED)
    throw new BundleError("invalid", `bundle entry ${shown} is under ${RESERVED}/, which skiff keeps for itself`);
  for (let i = 1; i < segments.length; i++) {
    if (links.has(segments.slice(0, i).join("/")))
      throw new BundleError("invalid", `bundle entry ${shown} lies below a link`);
  }
  if (entry.type === "SymbolicLink" || entry.type === "Link") {
    const target = entry.linkpath ?? "";
    if (!linkStaysInside(normal, target.replaceAll("\\", "/"), entry.type === "Link")) {
      throw new BundleError(
        "invalid",
        `bundle entry ${shown} is a link to ${JSON.stringify(target.slice(0, 200))}, outside the app folder`,
      );
    }
    links.add(normal);
  }
  return normal;
}

interface BundleInfo {
  /** The tar, uncompressed. */
  tar: Buffer;
  /** Paths of the entries, normalized ("/"-separated, no "./"). */
  entries: string[];
}

/** Decompresses and checks a bundle without writing anything; throws BundleError. */
export async function inspectBundle(
  bytes: Uint8Array,
  opts: { maxBytes: number; maxFiles?: number },
): Promise<BundleInfo> {
  const maxFiles = opts.maxFiles ?? DEFAULT_MAX_BUNDLE_FILES;
  if (bytes.length === 0) throw new BundleError("invalid", "the bundle is empty: send a gzipped tar of the app folder");
  if (bytes.length > opts.maxBytes)
    throw new BundleError(
      "too_large",
      `the bundle is ${bytes.length} bytes, more than the limit of ${opts.maxBytes} bytes (SKIFF_MAX_BUNDLE_BYTES)`,
    );
  if (bytes[0] !== GZIP_MAGIC[0] || bytes[1] !== GZIP_MAGIC[1])
    throw new BundleError("invalid", "the bundle is not gzip-compressed: send a gzipped tar of the app folder");
  let tar: Buffer;
  try {
    tar = gunzipSync(bytes, { maxOutputLength: opts.maxBytes });
  } catch (err) {
    if (err instanceof RangeError || (err as NodeJS.ErrnoException).code === "ERR_BUFFER_TOO_LARGE") {
      throw new BundleError(
        "too_large",
        `the bundle unpacks to more than the limit of ${opts.maxBytes} bytes (SKIFF_MAX_BUNDLE_BYTES)`,
        { cause: err },
      );
    }
    throw new BundleError("invalid", `the bundle is not valid gzip: ${(err as Error).message}`, { cause: err });
  }
  const entries: string[] = [];
  const links = new Set<string>();
  const targets: { path: string; target: string; hard: boolean }[] = [];
  /** Files seen so far: the only things a hard link may name (tar's own rule; a link to a folder can wedge the unpacker). */
  const files = new Set<string>();
  let strayHardLink: { path: string; target: string } | undefined;
  /** The type of the last entry of each configuration file's name at the root: the one left on disk. */
  const configTypes = new Map<string, string>();
  let failure: Error | undefined;
  const parser = new Parser({
    strict: true,
    onReadEntry: (entry) => {
      try {
        if (!failure) {
          const normal = checkEntry(entry, links);
          entries.push(normal);
          if ((CONFIG_FILES as readonly string[]).includes(normal)) configTypes.set(normal, entry.type);
          // A path that is a file and a folder at once (the unpacker can wait forever on it).
          for (let at = normal.indexOf("/"); at !== -1; at = normal.indexOf("/", at + 1))
            if (files.has(normal.slice(0, at)))
              throw new BundleError(
                "invalid",
                `bundle entry ${JSON.stringify(normal.slice(0, 200))} lies below a file`,
              );
          if (
            (entry.type === "SymbolicLink" || entry.type === "Link") &&
            wedgesUnpacker(entry.path, entry.linkpath ?? "")
          )
            throw new BundleError(
              "invalid",
              `bundle entry ${JSON.stringify(normal.slice(0, 200))} is a link whose path and target lie one inside the other`,
            );
          if (entry.type === "Link") {
            const target = (entry.linkpath ?? "")
              .split(/[\\/]+/)
              .filter((s) => s !== "" && s !== ".")
              .join("/");
            if (!files.has(target)) strayHardLink ??= { path: normal, target };
          }
          if (FILE_TYPES.has(entry.type)) files.add(normal);
          else files.delete(normal);
          if (entries.length > maxFiles)
            throw new BundleError(
              "invalid",
              `the bundle has more than ${maxFiles} entries, the most allowed (SKIFF_MAX_BUNDLE_FILES)`,
            );
          if (entry.type === "SymbolicLink" || entry.type === "Link")
            targets.push({
              path: normal,
              target: (entry.linkpath ?? "").replaceAll("\\", "/"),
              hard: entry.type === "Link",
            });
        }
      } catch (err) {
        failure = err as Error;
      }
      entry.resume();
    },
  });
  await new Promise<void>((resolve) => {
    parser.on("error", (err: Error) => {
      failure ??= new BundleError("invalid", `the bundle is not a valid tar: ${err.message}`, { cause: err });
      resolve();
    });
    parser.on("end", () => resolve());
    parser.end(tar);
  });
  if (failure) throw failure;
  // With every link known: no target may pass through one, whichever came first in the tar.
  for (const t of targets) {
    if (!targetStaysInside(t.path, t.target, t.hard, links))
      throw new BundleError(
        "invalid",
        `bundle entry ${JSON.stringify(t.path.slice(0, 200))} is a link whose target leaves the app folder or passes through another link`,
      );
  }
  if (strayHardLink)
    throw new BundleError(
      "invalid",
      `bundle entry ${JSON.stringify(strayHardLink.path.slice(0, 200))} is a hard link to ${JSON.stringify(strayHardLink.target.slice(0, 200))}, which is not a file earlier in the bundle`,
    );
  if (configTypes.size === 0)
    throw new BundleError("invalid", `the bundle has no ${APP_CONFIG_FILE} (or ${CEREBRIUM_CONFIG_FILE}) at its root`);
  if (configTypes.size > 1)
    throw new BundleError(
      "invalid",
      `the bundle has both ${APP_CONFIG_FILE} and ${CEREBRIUM_CONFIG_FILE} at its root: an app has one configuration file`,
    );
  // As packApp demands: a file, not a folder or a symbolic link (a hard link's content is a file).
  const [[configName, configType]] = configTypes;
  if (!FILE_TYPES.has(configType))
    throw new BundleError("invalid", `${configName} at the root of the bundle is a ${configType}, not a file`);
  return { tar, entries: entries.filter((e) => e !== "") };
}

/** Checks a bundle (see the header), then writes it into `dest`, which is created. */
export async function unpackBundle(
  bytes: Uint8Array,
  dest: string,
  opts: { maxBytes: number; maxFiles?: number },
): Promise<BundleInfo> {
  const info = await inspectBundle(bytes, opts);
  await mkdir(dest, { recursive: true });
  const unpack = extract({ cwd: dest, strict: true, preserveOwner: false, preservePaths: false });
  // After an error the unpacker goes on writing the entries it has begun: settle only once it is done,
  // so that nothing is written into `dest` after this returns.
  let failure: Error | undefined;
  await new Promise<void>((resolve) => {
    unpack.on("error", (err: Error) => {
      failure ??= new BundleError("invalid", `cannot unpack the bundle: ${err.message}`, { cause: err });
    });
    unpack.on("close", () => resolve());
    unpack.end(info.tar);
  });
  if (failure) throw failure;
  try {
    await checkWrittenLinks(dest);
  } catch (err) {
    await rm(dest, { recursive: true, force: true });
    await mkdir(dest, { recursive: true });
    throw err;
  }
  return info;
}

/** Every symbolic link under `dest`, as the file system resolves it, must land on something inside `dest`. */
async function checkWrittenLinks(dest: string): Promise<void> {
  const root = await realpath(dest);
  const walk = async (rel: string): Promise<void> => {
    for (const e of await readdir(path.join(root, rel), { withFileTypes: true })) {
      const p = rel === "" ? e.name : `${rel}/${e.name}`;
      if (e.isDirectory()) await walk(p);
      else if (e.isSymbolicLink()) {
        const real = await realpath(path.join(root, p)).catch(() => undefined);
        if (real === undefined || (real !== root && !real.startsWith(root + path.sep)))
          throw new BundleError(
            "invalid",
            `bundle entry ${JSON.stringify(p.slice(0, 200))} is a link that does not resolve to a file or folder of the app`,
          );
      }
    }
  };
  await walk("");
}
