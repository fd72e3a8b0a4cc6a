// App folders for tests: skiff.toml text built from a typed description
// (serialized by a TOML library, so it is always valid TOML), and an app's
// files written to a folder of their own. Tests of what the config parser
// refuses write their broken text by hand instead.
import { mkdir, mkdtemp, writeFile } from "node:fs/promises";
import path from "node:path";
import { stringify } from "smol-toml";

export interface CortexRuntime {
  kind: "cortex";
  language: "python" | "node";
  entry: string;
}

export interface CustomRuntime {
  kind: "custom";
  command: string[];
  healthcheck?: string;
  readycheck?: string;
  port?: number;
}

/** The [scaling] table, with skiff.toml's own key names. */
export interface Scaling {
  min_replicas?: number;
  max_replicas?: number;
  replica_concurrency?: number;
  cooldown?: number;
  response_grace_period?: number;
}

export interface SkiffTomlSpec {
  name: string;
  runtime: CortexRuntime | CustomRuntime;
  env?: Record<string, string>;
  scaling?: Scaling;
}

/** The text of a skiff.toml; tables left out of `spec` are left out of the file (keys left undefined too). */
export function skiffToml({ name, runtime, env, scaling }: SkiffTomlSpec): string {
  return stringify({ app: { name }, runtime, env, scaling });
}

/**
 * Writes an app's files (paths relative to the app folder, subfolders made as
 * needed) into a new folder under `parent`, and returns that folder.
 */
export async function writeApp(parent: string, files: Record<string, string | Uint8Array>): Promise<string> {
  const dir = await mkdtemp(path.join(parent, "app-"));
  for (const [name, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, name)), { recursive: true });
    await writeFile(path.join(dir, name), content);
  }
  return dir;
}
