// `npm run bench`: every benchmark, one after the other.
import { benchRunListing } from "./run-listing.js";
import { benchSyncInvoke } from "./sync-invoke.js";

const BENCHES: [string, () => Promise<void>][] = [
  ["run-listing", benchRunListing],
  ["sync-invoke", benchSyncInvoke],
];

for (const [name, bench] of BENCHES) {
  console.log(`== ${name}`);
  await bench();
}
