// Run once before the test files: the bundles of the server and of the CLI
// (bin/bundle.js) are made here, so that files which start them at the same
// time do not each make them.
import { bundleOf } from "../../bin/bundle.js";

export default async function setup(): Promise<void> {
  for (const [source, name] of [
    ["services/main.ts", "server"],
    ["services/cli/main.ts", "cli"],
  ]) {
    if ((await bundleOf(source, name)) === undefined) throw new Error(`could not bundle ${source}`);
  }
}
