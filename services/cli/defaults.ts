// Where the CLI sends requests and which token it sends, when not told:
// the URL `npm start` serves by default, and the admin token file that its
// bootstrap writes, in the current folder or in the checkout the CLI runs from.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { DEFAULT_DATA_DIR, DEFAULT_HOST, DEFAULT_PORT } from "../config/index.js";

export const DEFAULT_URL = `http://${DEFAULT_HOST}:${DEFAULT_PORT}`;

const checkout = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

/** Candidate admin token files, most specific first. */
function adminTokenFiles(env: NodeJS.ProcessEnv, cwd: string): string[] {
  const dirs = [env.SKIFF_DATA_DIR, path.join(cwd, DEFAULT_DATA_DIR), path.join(checkout, DEFAULT_DATA_DIR)];
  return [
    ...new Set(
      dirs.filter((d): d is string => d !== undefined && d !== "").map((d) => path.resolve(cwd, d, "admin-token")),
    ),
  ];
}

export interface Target {
  url: string;
  token: string | undefined;
  /** Where the token came from, for error messages. */
  tokenSource: string;
}

export function resolveTarget(flags: { url?: string; token?: string }, env: NodeJS.ProcessEnv, cwd: string): Target {
  const url = (flags.url ?? env.SKIFF_URL ?? DEFAULT_URL).replace(/\/+$/, "");
  if (flags.token !== undefined) return { url, token: flags.token, tokenSource: "--token" };
  if (env.SKIFF_TOKEN) return { url, token: env.SKIFF_TOKEN, tokenSource: "SKIFF_TOKEN" };
  for (const file of adminTokenFiles(env, cwd)) {
    try {
      const token = readFileSync(file, "utf8").trim();
      if (token !== "") return { url, token, tokenSource: file };
    } catch {
      // not there: try the next place
    }
  }
  return { url, token: undefined, tokenSource: "none" };
}
