// Where the CLI sends requests and which token it sends, when not told: the
// data folder of a running skiff (SKIFF_DATA_DIR, else `.data` of the current
// folder or of the checkout the CLI runs from) holds the URL it serves
// (`address`, written at start) and its admin token (`admin-token`).
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { ADDRESS_FILE, DEFAULT_DATA_DIR, DEFAULT_HOST, DEFAULT_PORT } from "../config/index.js";

export const DEFAULT_URL = `http://${DEFAULT_HOST}:${DEFAULT_PORT}`;

const checkout = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

/** Candidate data folders, most specific first. */
export function dataDirs(env: NodeJS.ProcessEnv, cwd: string): string[] {
  const dirs = [env.SKIFF_DATA_DIR, path.join(cwd, DEFAULT_DATA_DIR), path.join(checkout, DEFAULT_DATA_DIR)];
  return [...new Set(dirs.filter((d): d is string => d !== undefined && d !== "").map((d) => path.resolve(cwd, d)))];
}

export interface Target {
  url: string;
  /** Where the URL came from, for error messages. */
  urlSource: string;
  token: string | undefined;
  /** Where the token came from, for error messages. */
  tokenSource: string;
}

function firstLine(file: string): string | undefined {
  try {
    const text = readFileSync(file, "utf8").split("\n", 1)[0].trim();
    return text === "" ? undefined : text;
  } catch {
    return undefined; // not there: try the next place
  }
}

/**
 * The server: --url, SKIFF_URL, SKIFF_PORT (with SKIFF_HOST) as `npm start`
 * reads them, the address a running skiff wrote into its data folder, else
 * the default. The token: --token, SKIFF_TOKEN, else the data folder's admin
 * token. A token found in a data folder goes only to that folder's skiff:
 * to the address in that folder, unless the URL is written out (--url,
 * SKIFF_URL); without an address (its skiff is stopped), or with SKIFF_PORT
 * naming another server, the CLI refuses, since another folder's address,
 * the default port or that port may be another install's, or any local
 * process's, which would then hold this install's admin token.
 */
export function resolveTarget(flags: { url?: string; token?: string }, env: NodeJS.ProcessEnv, cwd: string): Target {
  const given = givenUrl(flags, env);
  const target = (server: { url: string; urlSource: string }, token: string | undefined, tokenSource: string) => ({
    url: server.url.replace(/\/+$/, ""),
    urlSource: server.urlSource,
    token,
    tokenSource,
  });
  if (flags.token !== undefined) return target(given ?? foundUrl(env, cwd), flags.token, "--token");
  if (env.SKIFF_TOKEN) return target(given ?? foundUrl(env, cwd), env.SKIFF_TOKEN, "SKIFF_TOKEN");
  for (const dir of dataDirs(env, cwd)) {
    const file = path.join(dir, "admin-token");
    const token = firstLine(file);
    if (token === undefined) continue;
    // A URL written out (--url, SKIFF_URL) is the user's choice; SKIFF_PORT may be set for another install's
    // `npm start`, so with it the token goes only where its folder's skiff runs.
    if (given && given.urlSource !== "SKIFF_PORT") return target(given, token, file);
    const addressFile = path.join(dir, ADDRESS_FILE);
    const url = firstLine(addressFile);
    if (url === undefined)
      throw new Error(
        `no skiff is running from ${dir}: it writes ${addressFile} while it runs, and its admin token (${file}) goes to that address only; start it, or give its URL with --url or SKIFF_URL`,
      );
    if (given && !sameServer(url, given.url))
      throw new Error(
        `the admin token in ${file} goes only to the skiff of that folder, at ${url} (${addressFile}), not to ${given.url} (SKIFF_PORT); for that server, pass its token with --token or SKIFF_TOKEN, or its data folder with SKIFF_DATA_DIR`,
      );
    return target({ url, urlSource: addressFile }, token, file);
  }
  return target(given ?? foundUrl(env, cwd), undefined, "none");
}

/** Whether two URLs name the same server (scheme, host and port; a path, a trailing slash and case aside). */
function sameServer(a: string, b: string): boolean {
  try {
    const [x, y] = [new URL(a), new URL(b)];
    return x.protocol === y.protocol && x.hostname === y.hostname && x.port === y.port;
  } catch {
    return false;
  }
}

/** The URL given by --url, SKIFF_URL or SKIFF_PORT (with SKIFF_HOST), if any. */
function givenUrl(flags: { url?: string }, env: NodeJS.ProcessEnv): { url: string; urlSource: string } | undefined {
  if (flags.url !== undefined) return { url: flags.url, urlSource: "--url" };
  if (env.SKIFF_URL) return { url: env.SKIFF_URL, urlSource: "SKIFF_URL" };
  // SKIFF_PORT=0 picks a free port: only the address file knows which.
  if (env.SKIFF_PORT && env.SKIFF_PORT.trim() !== "0") {
    const host = env.SKIFF_HOST?.trim() || DEFAULT_HOST;
    const reachable = host === "0.0.0.0" ? "127.0.0.1" : host === "::" ? "::1" : host;
    const shown = reachable.includes(":") ? `[${reachable}]` : reachable;
    return { url: `http://${shown}:${env.SKIFF_PORT.trim()}`, urlSource: "SKIFF_PORT" };
  }
  return undefined;
}

/** The address a running skiff wrote into the first data folder that has one, else the default. */
function foundUrl(env: NodeJS.ProcessEnv, cwd: string): { url: string; urlSource: string } {
  for (const dir of dataDirs(env, cwd)) {
    const file = path.join(dir, ADDRESS_FILE);
    const url = firstLine(file);
    if (url !== undefined) return { url, urlSource: file };
  }
  return { url: DEFAULT_URL, urlSource: "the default" };
}
