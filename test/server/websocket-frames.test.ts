// The frame reader skiff's WebSocket relay uses: whatever the chunking, the
// bytes it passes on are the bytes it got (or, at a message past the limit,
// exactly those before that message's frame), and it reads close frames,
// message counts and sizes. The frames are made by `ws`'s own Sender.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import * as ws from "ws";
import { CLOSE, closeFrame, FrameReader } from "../../services/server/websocket-frames.js";

type Frame = { opcode: number; payload: Buffer; fin: boolean };

/** ws's frame writer (its types leave it out). */
const { Sender } = ws as unknown as {
  Sender: {
    frame(
      data: Buffer,
      options: { fin: boolean; opcode: number; mask: boolean; readOnly: boolean; rsv1: boolean; maskBuffer?: Buffer },
    ): Buffer[];
  };
};

/** One frame as a client (masked) or a server (unmasked) writes it, by `ws`. */
function frame({ opcode, payload, fin }: Frame, masked: boolean): Buffer {
  const parts = Sender.frame(payload, {
    fin,
    opcode,
    mask: masked,
    readOnly: false,
    rsv1: false,
    maskBuffer: masked ? Buffer.from([1, 2, 3, 4]) : undefined,
  });
  return Buffer.concat(parts);
}

function close(code: number, reason: string): Buffer {
  const b = Buffer.alloc(2 + Buffer.byteLength(reason));
  b.writeUInt16BE(code, 0);
  b.write(reason, 2);
  return b;
}

/** Splits `bytes` at the given cut points (sorted, deduplicated) into chunks. */
function chunked(bytes: Buffer, cuts: number[]): Buffer[] {
  const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let at = 0;
  for (const p of points) {
    out.push(bytes.subarray(at, p));
    at = p;
  }
  out.push(bytes.subarray(at));
  return out;
}

function readAll(reader: FrameReader, chunks: Buffer[]): { passed: Buffer; tooLarge: boolean } {
  const passed: Buffer[] = [];
  let tooLarge = false;
  for (const c of chunks) {
    const r = reader.read(c);
    passed.push(...r.forward);
    if (r.tooLarge) tooLarge = true;
  }
  return { passed: Buffer.concat(passed), tooLarge };
}

const payloadSizes = fc.oneof(fc.integer({ min: 0, max: 130 }), fc.integer({ min: 65530, max: 65545 }));
const messages = fc.array(
  fc.record({
    size: payloadSizes,
    binary: fc.boolean(),
    fragments: fc.integer({ min: 1, max: 3 }),
  }),
  { maxLength: 6 },
);

/**
 * A stream of messages (possibly fragmented, with a ping after a message's
 * first frame), then a close frame; with each data frame's offset and the
 * size of its message so far.
 */
function stream(spec: { size: number; binary: boolean; fragments: number }[], masked: boolean) {
  const frames: Buffer[] = [];
  const data: { offset: number; messageSoFar: number }[] = [];
  let offset = 0;
  const push = (b: Buffer) => {
    frames.push(b);
    offset += b.length;
  };
  for (const m of spec) {
    const payload = Buffer.alloc(m.size, 0x61);
    const step = Math.ceil(m.size / m.fragments) || 1;
    const pieces: Buffer[] = [];
    for (let at = 0; at < m.size || pieces.length === 0; at += step) pieces.push(payload.subarray(at, at + step));
    let soFar = 0;
    pieces.forEach((p, i) => {
      soFar += p.length;
      data.push({ offset, messageSoFar: soFar });
      push(frame({ opcode: i === 0 ? (m.binary ? 2 : 1) : 0, payload: p, fin: i === pieces.length - 1 }, masked));
      if (i === 0) push(frame({ opcode: 9, payload: Buffer.from("ping"), fin: true }, masked));
    });
  }
  push(frame({ opcode: 8, payload: close(4001, "bye ✓"), fin: true }, masked));
  return { bytes: Buffer.concat(frames), data };
}

describe("websocket frames - FrameReader", () => {
  it("passes every byte on, in order, whatever the chunking; counts messages; reads the close frame", () => {
    fc.assert(
      fc.property(messages, fc.boolean(), fc.array(fc.nat(), { maxLength: 20 }), (spec, masked, cuts) => {
        const { bytes } = stream(spec, masked);
        const reader = new FrameReader();
        const { passed, tooLarge } = readAll(reader, chunked(bytes, cuts));
        expect(tooLarge).toBe(false);
        expect(passed.equals(bytes)).toBe(true);
        expect(reader.bytes).toBe(bytes.length);
        expect(reader.messages).toBe(spec.length);
        expect(reader.close).toEqual({ code: 4001, reason: "bye ✓" });
        expect(reader.atBoundary).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it("stops at the frame that takes a message past the limit: only the frames before it pass", () => {
    fc.assert(
      fc.property(
        messages,
        fc.integer({ min: 0, max: 70_000 }),
        fc.array(fc.nat(), { maxLength: 20 }),
        (spec, limit, cuts) => {
          const { bytes, data } = stream(spec, true);
          const stopAt = data.find((d) => d.messageSoFar > limit)?.offset;
          const { passed, tooLarge } = readAll(new FrameReader({ maxMessageBytes: limit }), chunked(bytes, cuts));
          expect(tooLarge).toBe(stopAt !== undefined);
          expect(passed.equals(bytes.subarray(0, stopAt ?? bytes.length))).toBe(true);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("a message of exactly the limit passes; one byte more stops, fragmented or not", () => {
    for (const limit of [0, 125, 126, 65536]) {
      const exact = frame({ opcode: 2, payload: Buffer.alloc(limit), fin: true }, true);
      expect(new FrameReader({ maxMessageBytes: limit }).read(exact).tooLarge).toBeUndefined();
      const over = frame({ opcode: 2, payload: Buffer.alloc(limit + 1), fin: true }, true);
      expect(new FrameReader({ maxMessageBytes: limit }).read(over)).toEqual({ forward: [], tooLarge: { limit } });
      const first = frame({ opcode: 1, payload: Buffer.alloc(limit), fin: false }, true);
      const last = frame({ opcode: 0, payload: Buffer.alloc(1), fin: true }, true);
      const r = new FrameReader({ maxMessageBytes: limit }).read(Buffer.concat([first, last]));
      expect(r.tooLarge).toEqual({ limit });
      expect(Buffer.concat(r.forward).equals(first)).toBe(true);
    }
  });

  it("a close frame without a code reads 1005; a server's unmasked close frame is read too", () => {
    const reader = new FrameReader();
    reader.read(frame({ opcode: 8, payload: Buffer.alloc(0), fin: true }, false));
    expect(reader.close).toEqual({ code: CLOSE.NO_STATUS, reason: "" });
  });

  it("skiff's own close frames read back as written; a long reason is cut on a character boundary", () => {
    for (const masked of [true, false]) {
      const reader = new FrameReader();
      reader.read(closeFrame(1009, "message larger than 10 bytes", masked));
      expect(reader.close).toEqual({ code: 1009, reason: "message larger than 10 bytes" });
      const long = new FrameReader();
      const bytes = closeFrame(1008, "é".repeat(100), masked);
      expect(bytes.length).toBeLessThanOrEqual(2 + (masked ? 4 : 0) + 125);
      long.read(bytes);
      expect(long.close!.reason).toBe("é".repeat(61));
    }
  });

  it("a 64-bit length too large to count is over any limit", () => {
    const head = Buffer.from([0x82, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4]);
    const r = new FrameReader({ maxMessageBytes: 1 << 30 }).read(head);
    expect(r.tooLarge).toEqual({ limit: 1 << 30 });
    expect(r.forward).toEqual([]);
  });
});
