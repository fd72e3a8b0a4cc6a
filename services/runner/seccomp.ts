// The seccomp filter every sandbox stage runs under, written by
// seccomp-filter.py (libseccomp's Python bindings) as a BPF program.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { STAGE_ENV } from "./sandbox-argv.js";

/** Debian's interpreter, which has libseccomp's bindings (python3-seccomp), to write the seccomp filter. */
const SECCOMP_PYTHON = "/usr/bin/python3";
const SECCOMP_SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), "seccomp-filter.py");

/** Writes the filter; throws, saying what is missing, when it cannot. SandboxHost keeps it once written. */
export function writeSeccompFilter(): Buffer {
  if (!existsSync(SECCOMP_PYTHON)) throw new Error(`${SECCOMP_PYTHON} (Debian's python3) is missing`);
  let program: Buffer;
  try {
    program = execFileSync(SECCOMP_PYTHON, [SECCOMP_SCRIPT], {
      env: STAGE_ENV,
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 10_000,
    });
  } catch (err) {
    const e = err as { stderr?: Buffer; message: string };
    throw new Error(
      `cannot write the sandbox's seccomp filter (needs Debian's python3-seccomp): ${(e.stderr?.toString() || e.message).trim().slice(-300)}`,
    );
  }
  if (program.length === 0 || program.length % 8 !== 0)
    throw new Error(`the seccomp filter is not a BPF program (${program.length} bytes)`);
  return program;
}
