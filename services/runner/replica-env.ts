// What a replica sees of the machine: its own working folder and an
// environment made only of fixed values, the app's [env] and PORT, never
// the platform's own variables or secrets.
import { cp, mkdir, rm, stat, symlink } from "node:fs/promises";
import path from "node:path";

/** The only PATH a replica gets, so that it finds the system's programs and nothing of the platform's. */
export const REPLICA_PATH = "/usr/local/bin:/usr/bin:/bin";

/** Where a Custom app's program is found, on this machine: its venv's bin (cerebrium.toml's pip dependencies) first. */
export function programPath(venvPython: string | undefined): string[] {
  return [...(venvPython ? [path.dirname(venvPython)] : []), ...REPLICA_PATH.split(":")];
}

/**
 * PATH, HOME (the replica's folder) and LANG, then the app's [env] (which
 * may override those three), then PORT.
 */
export function replicaEnv(appEnv: Record<string, string>, home: string, port: number): Record<string, string> {
  return { PATH: REPLICA_PATH, HOME: home, LANG: "C.UTF-8", ...appEnv, PORT: String(port) };
}

/**
 * The whole environment of a dependency install: fixed values, nothing of
 * the operator's (a registry token in npm_config_* or PIP_* would be handed
 * to every tenant's install scripts) and nothing of the platform's. HOME
 * and the caches are in the sandbox's /tmp.
 */
export function installEnv(): Record<string, string> {
  return {
    PATH: REPLICA_PATH,
    HOME: "/tmp",
    LANG: "C.UTF-8",
    npm_config_cache: "/tmp/.npm",
    npm_config_update_notifier: "false",
    PIP_DISABLE_PIP_VERSION_CHECK: "1",
    PIP_NO_INPUT: "1",
  };
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
