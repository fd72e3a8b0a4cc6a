// Hand-made tar entries for tests of what unpackBundle refuses: paths and
// link targets that no honest packer writes.
import { gzipSync } from "node:zlib";
import { Header, type HeaderData } from "tar";
import { skiffToml } from "./apps.js";

export interface RawEntry {
  path: string;
  type?: HeaderData["type"];
  linkpath?: string;
  body?: string | Buffer;
}

export function rawTar(entries: RawEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? "");
    const h = new Header({
      path: e.path,
      type: e.type ?? "File",
      linkpath: e.linkpath,
      size: body.length,
      mode: e.type === "Directory" ? 0o755 : 0o644,
      mtime: new Date(0),
      uid: 0,
      gid: 0,
    });
    const block = Buffer.alloc(512);
    h.encode(block, 0);
    blocks.push(block, body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return gzipSync(Buffer.concat(blocks));
}

export const TOML = skiffToml({ name: "raw", runtime: { kind: "custom", command: ["node", "server.mjs"] } });
