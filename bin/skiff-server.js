#!/usr/bin/env node
// The skiff server (services/main.ts: `npm start`), run from its bundle
// (bin/bundle.js), made on first use and again when a file in it changes.
// SKIFF_WORKERS' workers run this file again (node:cluster forks it).
import { runBundled } from "./bundle.js";

await runBundled("services/main.ts", "server");
