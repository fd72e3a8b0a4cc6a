// Writes the committed OpenAPI documents (gen/openapi/*.json). Run by
// `npm run generate` after `buf generate`; openapiFiles() lets a test check
// the committed files are fresh without writing them.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { openapiDocument, SKIFF_APIS } from "../services/server/index.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Relative path → file text: pretty-printed JSON with a trailing newline, the same on every run. */
export function openapiFiles(): Record<string, string> {
  return Object.fromEntries(
    SKIFF_APIS.map((api) => [api.file, `${JSON.stringify(openapiDocument(api.services, api.info), null, 2)}\n`]),
  );
}

function writeOpenapiFiles(): void {
  for (const [file, text] of Object.entries(openapiFiles())) {
    const path = join(ROOT, file);
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text);
  }
}

// Importing this module (as the freshness test does) must not write.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) writeOpenapiFiles();
