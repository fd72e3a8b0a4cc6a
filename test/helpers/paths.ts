// The test folder, which fixtures and the repository root are found from
// wherever a test file sits in the tree.
import path from "node:path";

export const TEST_ROOT = path.resolve(import.meta.dirname, "..");

/** The skiff server as `npm start` runs it: `node SKIFF_SERVER [--roles …]`. */
export const SKIFF_SERVER = path.resolve(TEST_ROOT, "..", "bin", "skiff-server.js");
