// What a replica sees of the machine: its own working folder and an
// environment made only of fixed values, the app's [env] and PORT, never
// the platform's own variables or secrets.
import { cp, mkdir, rm, stat, symlink } from "node:fs/promises";
import path from "node:path";

/** The only PATH a replica gets, so that it finds the system's programs and nothing of the platform's. */
export const REPLICA_PATH = "/usr/local/bin:/usr/bin:/bin";

/**
 * PATH, HOME (the replica's folder) and LANG, then the app's [env] (which
 * may override those three), then PORT.
 */
export function replicaEnv(appEnv: Record<string, string>, home: string, port: number): Record<string, string> {
  return { PATH: REPLICA_PATH, HOME: home, LANG: "C.UTF-8", ...appEnv, PORT: String(port) };
}

/**
 * Installing dependencies needs the machine's package settings (proxy, npm
 * and pip configuration and caches under HOME) but none of the platform's
 * SKIFF_* settings or other secrets, since install scripts are the app's code.
 */
export function installEnv(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const out: Record<string, string> = { PATH: env.PATH ?? REPLICA_PATH, LANG: "C.UTF-8" };
  if (env.HOME) out.HOME = env.HOME;
  for (const [name, value] of Object.entries(env)) {
    if (value !== undefined && /^(PIP_|npm_config_|https?_proxy$|no_proxy$)/i.test(name)) out[name] = value;
  }
  return out;
}

/** Folders of a deployment that replicas share instead of copying. */
const SHARED = new Set(["node_modules", ".skiff"]);

/**
 * Copies the deployment folder for one replica. node_modules is linked, not
 * copied: installed once per deployment, and large.
 */
export async function makeWorkDir(source: string, dest: string): Promise<void> {
  await rm(dest, { recursive: true, force: true });
  await mkdir(path.dirname(dest), { recursive: true });
  await cp(source, dest, {
    recursive: true,
    verbatimSymlinks: true,
    filter: (src) => src === source || !SHARED.has(path.relative(source, src)),
  });
  const modules = path.join(source, "node_modules");
  const installed = await stat(modules).then(
    (s) => s.isDirectory(),
    () => false,
  );
  if (installed) await symlink(modules, path.join(dest, "node_modules"), "dir");
}
