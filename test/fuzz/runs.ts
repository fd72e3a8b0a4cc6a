// How many cases each fuzz property runs: FUZZ_RUNS, default 500 so that
// `npm test` runs the fuzz project at a modest size; `npm run test:fuzz`
// sets 10,000.
export const FUZZ_RUNS = runs(process.env.FUZZ_RUNS);

function runs(value: string | undefined): number {
  if (value === undefined || value === "") return 500;
  if (!/^[1-9][0-9]*$/.test(value)) throw new Error(`FUZZ_RUNS must be a positive integer, got "${value}"`);
  return Number(value);
}

/**
 * A test's time limit, there to stop a hang (a case takes a few milliseconds): room for
 * `perCaseMs` a case on a heavily loaded machine, never under a minute.
 */
export function fuzzTimeout(perCaseMs: number): number {
  return Math.max(60_000, FUZZ_RUNS * perCaseMs);
}
