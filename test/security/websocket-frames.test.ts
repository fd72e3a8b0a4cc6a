// SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES is "a message size limit enforced before
// the bytes reach the app" (docs/security.md). A caller may put its payload
// in a frame that is neither text, binary nor continuation: one of a
// reserved opcode (3-7, 11-15), or a control frame (a ping of a gigabyte,
// where RFC 6455 allows 125 bytes), which the app has to take or skip whole
// before it can fail the connection. Every frame's payload counts against
// the limit.
import { describe, expect, it } from "vitest";
import { FrameReader } from "../../services/server/websocket-frames.js";

const LIMIT = 1024;

/** A masked frame header (as a caller sends it) with a 64-bit length, and `length` bytes of payload. */
function frame(opcode: number, length: number, fin = true): Buffer {
  const head = Buffer.alloc(14);
  head[0] = (fin ? 0x80 : 0) | opcode;
  head[1] = 0x80 | 127;
  head.writeUInt32BE(Math.floor(length / 2 ** 32), 2);
  head.writeUInt32BE(length >>> 0, 6);
  head.writeUInt32BE(0x01020304, 10);
  return Buffer.concat([head, Buffer.alloc(length, 0x61)]);
}

/** What the reader lets through of `bytes`, and whether it stopped them. */
function read(bytes: Buffer): { passed: number; tooLarge: boolean } {
  const r = new FrameReader({ maxMessageBytes: LIMIT }).read(bytes);
  return { passed: r.forward.reduce((n, b) => n + b.length, 0), tooLarge: r.tooLarge !== undefined };
}

describe("SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES holds for every frame a caller sends", () => {
  it("stops a text message past the limit", () => {
    expect(read(frame(0x1, 64 * LIMIT))).toEqual({ passed: 0, tooLarge: true });
  });

  for (const opcode of [0x3, 0x7, 0xb, 0xf])
    it(`stops a frame of reserved opcode ${opcode} past the limit`, () => {
      expect(read(frame(opcode, 64 * LIMIT))).toEqual({ passed: 0, tooLarge: true });
    });

  it("stops a ping past the limit", () => {
    expect(read(frame(0x9, 64 * LIMIT))).toEqual({ passed: 0, tooLarge: true });
  });

  it("stops a reserved frame past the limit that follows a whole message", () => {
    const first = frame(0x2, 10);
    expect(read(Buffer.concat([first, frame(0x3, 64 * LIMIT)]))).toEqual({ passed: first.length, tooLarge: true });
  });

  it("still passes small frames of every kind", () => {
    const bytes = Buffer.concat([frame(0x1, 10, false), frame(0x9, 5), frame(0x0, 10), frame(0xa, 0), frame(0x2, 100)]);
    expect(read(bytes)).toEqual({ passed: bytes.length, tooLarge: false });
  });
});
