// Run once before the test files: the bundles of the server and of the CLI
// (bin/bundle.js) are made here, so that files which start them at the same
// time do not each make them.
import { bundleAll } from "../../bin/bundle.js";

export default async function setup(): Promise<void> {
  const failed = await bundleAll();
  if (failed.length > 0) throw new Error(`could not bundle ${failed.join(", ")}`);
}
