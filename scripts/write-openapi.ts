// Writes the committed OpenAPI documents (gen/openapi/*.json). Run by
// `npm run generate` after `buf generate`; `--out <folder>` writes them
// elsewhere, which lets a test compare what a fresh process writes with the
// committed files.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { SKIFF_APIS } from "../services/apis.js";
import { openapiDocument } from "../services/server/index.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Relative path → file text: pretty-printed JSON with a trailing newline, the same on every run. */
export function openapiFiles(): Record<string, string> {
  return Object.fromEntries(
    SKIFF_APIS.map((api) => [api.file, `${JSON.stringify(openapiDocument(api.services, api.info), null, 2)}\n`]),
  );
}

/** Writes the files under `into` (the repository, or another folder for a test to compare). */
function writeOpenapiFiles(into: string): void {
  for (const [file, text] of Object.entries(openapiFiles())) {
    const path = join(into, file);
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text);
  }
}

// Importing this module (as the freshness test does) must not write.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const out = process.argv.indexOf("--out");
  writeOpenapiFiles(out >= 0 && process.argv[out + 1] ? process.argv[out + 1] : ROOT);
}
