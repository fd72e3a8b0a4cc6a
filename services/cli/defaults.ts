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

/** Candidate admin token files, most specific first. */
export function adminTokenFiles(env: NodeJS.ProcessEnv, cwd: string): string[] {
  return dataDirs(env, cwd).map((d) => path.join(d, "admin-token"));
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
    const text = readFileSync(file, "utf8").trim();
    return text === "" ? undefined : text;
  } catch {
    return undefined; // not there: try the next place
  }
}

/**
 * The server: --url, SKIFF_URL, SKIFF_PORT (with SKIFF_HOST) as `npm start`
 * reads them, the address a running skiff wrote into its data folder, else
 * the default. The token: --token, SKIFF_TOKEN, else the data folder's admin
 * token.
 */
export function resolveTarget(flags: { url?: string; token?: string }, env: NodeJS.ProcessEnv, cwd: string): Target {
  const { url, urlSource } = serverUrl(flags, env, cwd);
  const target = (token: string | undefined, tokenSource: string): Target => ({
    url: url.replace(/\/+$/, ""),
    urlSource,
    token,
    tokenSource,
  });
  if (flags.token !== undefined) return target(flags.token, "--token");
  if (env.SKIFF_TOKEN) return target(env.SKIFF_TOKEN, "SKIFF_TOKEN");
  for (const file of adminTokenFiles(env, cwd)) {
    const token = firstLine(file);
    if (token !== undefined) return target(token, file);
  }
  return target(undefined, "none");
}

function serverUrl(flags: { url?: string }, env: NodeJS.ProcessEnv, cwd: string): { url: string; urlSource: string } {
  if (flags.url !== undefined) return { url: flags.url, urlSource: "--url" };
  if (env.SKIFF_URL) return { url: env.SKIFF_URL, urlSource: "SKIFF_URL" };
  // SKIFF_PORT=0 picks a free port: only the address file knows which.
  if (env.SKIFF_PORT && env.SKIFF_PORT.trim() !== "0") {
    const host = env.SKIFF_HOST?.trim() || DEFAULT_HOST;
    const reachable = host === "0.0.0.0" ? "127.0.0.1" : host === "::" ? "::1" : host;
    const shown = reachable.includes(":") ? `[${reachable}]` : reachable;
    return { url: `http://${shown}:${env.SKIFF_PORT.trim()}`, urlSource: "SKIFF_PORT" };
  }
  for (const dir of dataDirs(env, cwd)) {
    const file = path.join(dir, ADDRESS_FILE);
    const url = firstLine(file);
    if (url !== undefined) return { url, urlSource: file };
  }
  return { url: DEFAULT_URL, urlSource: "the default" };
}
