// `npm run bench` (`-- --quick` for a shorter run): the run pipeline against
// direct calls and nginx, webhook latency, cold starts, revocation, memory,
// run listing and WebSockets; writes bench/results/latest.json (and
// websocket.json) and prints the ratios.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { benchPipeline, writeResults } from "./pipeline.js";
import { benchRunListing } from "./run-listing.js";
import { benchWebSocket } from "./websocket.js";

const argv = process.argv.slice(2);
const quick = argv.includes("--quick");

console.log("== pipeline");
const results = await benchPipeline(argv);
console.log("== run listing");
const listing = await benchRunListing(quick ? 100_000 : 1_000_000);
results.list_runs_ms = Number(listing.pageMs.toFixed(3));
results.list_runs_rest = { p50_ms: listing.restPageMs, p99_ms: listing.restPageP99Ms };
// How fast the run history takes in runs, with the machine otherwise idle but for the publisher: every sync run
// is a row, so no sync rate above it can be kept up for long, whatever the request path costs.
results.history_projected_per_s = listing.projectedPerS;
results.ratios.history_projection_vs_nginx_sync = Number((listing.projectedPerS / results.sync.nginx.rps).toFixed(2));
results.ratios.list_runs_vs_kv_get = Number((listing.pageMs / listing.kvGetMs).toFixed(2));
const soak = await readFile(path.join(import.meta.dirname, "results", "soak.json"), "utf8").then(
  (t) => JSON.parse(t) as { rss_mb: { end: number } },
  () => undefined,
);
results.rss_mb.after_soak = soak?.rss_mb.end ?? null;
console.log("== WebSockets");
const ws = await benchWebSocket(quick);
for (const [name, ratio] of Object.entries(ws.ratios)) results.ratios[`websocket_${name}`] = ratio;
const file = await writeResults("latest.json", results);
console.log(`\n${JSON.stringify(results.ratios, null, 2)}\nwritten to ${path.relative(process.cwd(), file)}`);
