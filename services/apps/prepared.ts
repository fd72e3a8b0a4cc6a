// What preparing a deployment learns (runner/prepare.ts does it on each
// machine), and the check a deployment passes before it is recorded: the
// management role is handed a PrepareBundle by the process wiring, which
// prepares in the runner's deployment cache when the process runs a runner.
import type { AppConfig } from "./app-config.js";

export interface PreparedDeployment {
  /** Cortex: the public function names, known without a replica. */
  functions?: string[];
  /** Cortex Python with a requirements.txt: the interpreter of its venv. */
  python?: string;
  /** When a build installed dependencies: the bytes of the folder's files it left (the deployment's size on disk). */
  bytes?: number;
}

/** A bundle that passed every check and was prepared. */
interface CheckedBundle {
  config: AppConfig;
  prepared: PreparedDeployment;
  /** What the deployment takes on disk: its tar, or what its build left, bytes. */
  unpackedBytes: number;
  /** What its configuration file asks that skiff ignores, each "file:line: ...". */
  warnings: string[];
}

/**
 * Unpacks a bundle with every check, reads its skiff.toml (or cerebrium.toml) and prepares it
 * (dependencies, Cortex functions) for the project deploying it. Throws
 * BundleError, AppConfigError or PrepareFailed.
 */
export type PrepareBundle = (digest: string, bytes: Uint8Array, projectId: string) => Promise<CheckedBundle>;
