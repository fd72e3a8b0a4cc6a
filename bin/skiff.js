#!/usr/bin/env node
// The `skiff` command: the TypeScript CLI (services/cli/main.ts) run from its
// bundle (bin/bundle.js), made on first use and again when a file in it changes.
import { runBundled } from "./bundle.js";

await runBundled("services/cli/main.ts", "cli");
