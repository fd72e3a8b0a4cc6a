// Tests that need something of the machine (root, cgroups, slirp4netns,
// bwrap): where the code under test finds the machine cannot do it, the test
// is skipped with a warning on a developer's machine, and fails under CI
// (CI=true), naming what is missing, so that a CI machine lacking it never
// passes without running the test.

/** Whether the tests run under CI: CI set to anything but "", "0" or "false". */
export function underCI(): boolean {
  const ci = process.env.CI;
  return ci !== undefined && ci !== "" && ci !== "0" && ci.toLowerCase() !== "false";
}

/**
 * Whether `what` (the tests of a file or a describe) can run here: `missing`
 * says why not, or is undefined when they can. Without CI it warns and gives
 * false (for describe.skipIf); under CI it throws, which fails the file.
 */
export function machineCan(what: string, missing: string | undefined): boolean {
  if (missing === undefined) return true;
  if (underCI()) throw new Error(`${what} cannot run on this machine (CI=true fails instead of skipping): ${missing}`);
  console.warn(`${what}: skipped, this machine cannot run it: ${missing}`);
  return false;
}
