// `npm run bench`: every benchmark, one after the other.
import { benchRunListing } from "./run-listing.js";

const BENCHES: [string, () => Promise<void>][] = [["run-listing", benchRunListing]];

for (const [name, bench] of BENCHES) {
  console.log(`== ${name}`);
  await bench();
}
