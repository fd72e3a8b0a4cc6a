// What a project secret may be called and hold. A secret becomes an
// environment variable of the project's replicas, so its name is a variable
// name, and never one that skiff sets itself.

/** An environment variable name. */
const SECRET_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_SECRET_NAME_LENGTH = 128;
/** The largest value, in bytes of UTF-8. */
const MAX_SECRET_VALUE_BYTES = 64 * 1024;
/** Names skiff gives replicas itself (replica-env.ts): a secret may not take their place. */
const RESERVED_SECRET_NAMES: readonly string[] = ["PORT", "PATH", "HOME", "LANG"];
/** Prefixes of skiff's own variables, any case (the sandbox's gate uses `skiff_` names). */
const RESERVED_PREFIX = /^skiff_/i;

/**
 * A name the shell that starts every sandboxed app (the gate, runner/sandbox-argv.ts) takes for a number: a
 * value that is not one stops the app before it runs. Neither a secret nor `[env]` may take it.
 */
export const SHELL_NUMBER = "OPTIND";
export const SHELL_NUMBER_PROBLEM =
  "is the shell's (the sandbox starts every app through sh, which takes OPTIND for a number)";

/** Why `name` cannot name a secret, or undefined when it can. */
export function secretNameProblem(name: string): string | undefined {
  if (name === "") return "is required";
  if (name.length > MAX_SECRET_NAME_LENGTH) return `must be at most ${MAX_SECRET_NAME_LENGTH} characters`;
  if (!SECRET_NAME.test(name))
    return "must be an environment variable name: a letter or _, then letters, digits or _ ([A-Za-z_][A-Za-z0-9_]*)";
  if (RESERVED_SECRET_NAMES.includes(name)) return `is set by skiff itself (${RESERVED_SECRET_NAMES.join(", ")})`;
  if (name === SHELL_NUMBER) return SHELL_NUMBER_PROBLEM;
  if (RESERVED_PREFIX.test(name)) return "starts with SKIFF_, which skiff keeps for its own variables";
  return undefined;
}

/** Why `value` cannot be a secret's value, or undefined when it can. */
export function secretValueProblem(value: string): string | undefined {
  const bytes = Buffer.byteLength(value, "utf8");
  if (bytes > MAX_SECRET_VALUE_BYTES) return `is ${bytes} bytes, more than the ${MAX_SECRET_VALUE_BYTES} allowed`;
  if (value.includes("\0")) return "contains a NUL character, which an environment variable cannot hold";
  return undefined;
}
