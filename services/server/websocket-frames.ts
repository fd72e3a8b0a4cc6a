// Reading the WebSocket frames (RFC 6455 §5) that pass through skiff
// between a caller and an app, without changing them: their sizes, the
// messages they make, and the close frame's code and reason. skiff stays a
// byte proxy (the app does its own handshake and framing); this reader only
// decides where the forwarded stream may be cut: a frame's header is held
// until it is whole, so a message found too large is stopped before its
// first byte leaves, and skiff can put a close frame of its own on a stream
// that is at a frame boundary.
//
//   const reader = new FrameReader({ maxMessageBytes: 1 << 20 });
//   const { forward, tooLarge } = reader.read(chunk); // write `forward`, in order
//
// Sizes count payload bytes as they travel (compressed, when the two ends
// agreed on permessage-deflate).

import { randomBytes } from "node:crypto";

export const CLOSE = {
  NORMAL: 1000,
  GOING_AWAY: 1001,
  PROTOCOL_ERROR: 1002,
  /** No close code in the frame (never sent). */
  NO_STATUS: 1005,
  /** The connection ended without a close frame (never sent). */
  ABNORMAL: 1006,
  POLICY_VIOLATION: 1008,
  MESSAGE_TOO_BIG: 1009,
  INTERNAL_ERROR: 1011,
} as const;

const OP_CONTINUATION = 0x0;
const OP_TEXT = 0x1;
const OP_BINARY = 0x2;
const OP_CLOSE = 0x8;
/** Control frames carry at most this much payload. */
const MAX_CONTROL_PAYLOAD = 125;
/** A close reason is at most 123 bytes: 125 less the code's two. */
const MAX_CLOSE_REASON = MAX_CONTROL_PAYLOAD - 2;
/** Lengths past 2^53 cannot be counted exactly: the high word must stay below 2^21. */
const MAX_LENGTH_HIGH_WORD = 0x1fffff;

export interface CloseFrame {
  code: number;
  reason: string;
}

export interface ReadResult {
  /** The bytes to pass on, in order: the chunk's, less a frame header not yet whole (held for the next chunk). */
  forward: Buffer[];
  /** Set when a message grew past maxMessageBytes: nothing of its frame is in `forward`, and nothing more may pass. */
  tooLarge?: { limit: number };
}

export interface FrameReaderOptions {
  /** Largest message (the payload of its frames together); undefined: no limit. */
  maxMessageBytes?: number;
}

const utf8 = new TextDecoder("utf-8", { fatal: false });

export class FrameReader {
  /** Bytes passed on. */
  bytes = 0;
  /** Whole data messages passed on (a message ends with its FIN frame). */
  messages = 0;
  /** The first close frame seen, once seen. */
  close: CloseFrame | undefined;

  private readonly header = Buffer.alloc(14);
  private headerHave = 0;
  private headerNeed = 2;
  private payloadLeft = 0;
  private opcode = 0;
  private fin = false;
  private mask: Buffer | undefined;
  /** Payload bytes read of the current frame (the mask's offset). */
  private payloadAt = 0;
  /** The payload of a close frame being read. */
  private closePayload: Buffer | undefined;
  /** Payload of the message under way. */
  private messageBytes = 0;
  private stopped = false;

  constructor(private readonly opts: FrameReaderOptions = {}) {}

  /** Whether what was passed on so far ends at a frame boundary, where skiff may add a frame of its own. */
  get atBoundary(): boolean {
    return this.stopped || (this.headerHave === 0 && this.payloadLeft === 0);
  }

  read(chunk: Buffer): ReadResult {
    if (this.stopped) return { forward: [] };
    const forward: Buffer[] = [];
    // A header begun in an earlier chunk: its bytes are held, and pass once it is whole.
    let held = this.headerHave > 0 ? Buffer.from(this.header.subarray(0, this.headerHave)) : undefined;
    let headerStart = 0;
    let i = 0;
    while (i < chunk.length) {
      if (this.payloadLeft > 0) {
        const n = Math.min(this.payloadLeft, chunk.length - i);
        if (this.closePayload) this.collectClose(chunk, i, n);
        this.payloadLeft -= n;
        this.payloadAt += n;
        i += n;
        if (this.payloadLeft === 0) this.frameEnded();
        continue;
      }
      if (this.headerHave === 0) headerStart = i;
      this.header[this.headerHave++] = chunk[i++];
      if (this.headerHave === 2) this.headerNeed = headerLength(this.header);
      if (this.headerHave < this.headerNeed) continue;
      const tooLarge = this.frameStarts();
      if (tooLarge) {
        this.stopped = true;
        this.headerHave = 0;
        if (headerStart > 0) forward.push(chunk.subarray(0, headerStart));
        this.count(forward);
        return { forward, tooLarge };
      }
      if (held) {
        forward.push(held);
        held = undefined;
      }
      if (this.payloadLeft === 0) this.frameEnded();
    }
    // A header still incomplete at the end of the chunk is held back.
    const end = this.headerHave > 0 ? headerStart : chunk.length;
    if (end > 0 && !(this.headerHave > 0 && held)) forward.push(chunk.subarray(0, end));
    this.count(forward);
    return { forward };
  }

  private count(forward: Buffer[]): void {
    for (const b of forward) this.bytes += b.length;
  }

  /** The header is whole: the frame's length, mask and kind; a limit it breaks. */
  private frameStarts(): { limit: number } | undefined {
    const h = this.header;
    this.fin = (h[0] & 0x80) !== 0;
    this.opcode = h[0] & 0x0f;
    const len7 = h[1] & 0x7f;
    let at = 2;
    let length = len7;
    if (len7 === 126) {
      length = h.readUInt16BE(2);
      at = 4;
    } else if (len7 === 127) {
      const high = h.readUInt32BE(2);
      length = high > MAX_LENGTH_HIGH_WORD ? Number.MAX_SAFE_INTEGER : high * 2 ** 32 + h.readUInt32BE(6);
      at = 10;
    }
    this.mask = (h[1] & 0x80) !== 0 ? Buffer.from(h.subarray(at, at + 4)) : undefined;
    this.headerHave = 0;
    this.headerNeed = 2;
    this.payloadLeft = length;
    this.payloadAt = 0;
    if (this.opcode === OP_TEXT || this.opcode === OP_BINARY) this.messageBytes = length;
    else if (this.opcode === OP_CONTINUATION) this.messageBytes += length;
    // Every frame counts against the limit: a data frame toward its message, any other (a control frame, or one
    // of a reserved opcode) on its own, allowed a control frame's 125 bytes; else such a frame would carry any
    // number of bytes past the limit to the app.
    const data = this.opcode === OP_TEXT || this.opcode === OP_BINARY || this.opcode === OP_CONTINUATION;
    const limit = this.opts.maxMessageBytes;
    if (limit !== undefined && (data ? this.messageBytes > limit : length > Math.max(limit, MAX_CONTROL_PAYLOAD)))
      return { limit };
    this.closePayload = this.opcode === OP_CLOSE ? Buffer.alloc(Math.min(length, MAX_CONTROL_PAYLOAD)) : undefined;
    return undefined;
  }

  private collectClose(chunk: Buffer, from: number, n: number): void {
    const into = this.closePayload!;
    for (let k = 0; k < n && this.payloadAt + k < into.length; k++) {
      const at = this.payloadAt + k;
      into[at] = this.mask ? chunk[from + k] ^ this.mask[at & 3] : chunk[from + k];
    }
  }

  private frameEnded(): void {
    if (this.opcode === OP_CLOSE && this.closePayload) {
      const p = this.closePayload;
      this.closePayload = undefined;
      this.close ??= {
        code: p.length >= 2 ? p.readUInt16BE(0) : CLOSE.NO_STATUS,
        reason: p.length > 2 ? utf8.decode(p.subarray(2)) : "",
      };
    } else if (this.fin && this.opcode < OP_CLOSE) {
      this.messages++;
    }
  }
}

/** The header's whole length, from its first two bytes. */
function headerLength(h: Buffer): number {
  const len7 = h[1] & 0x7f;
  const extended = len7 === 126 ? 2 : len7 === 127 ? 8 : 0;
  return 2 + extended + ((h[1] & 0x80) !== 0 ? 4 : 0);
}

/**
 * A close frame of skiff's own: unmasked toward the caller (skiff is its
 * server), masked toward the app (skiff is its client, RFC 6455 §5.3). The
 * reason is cut to fit a control frame, on a character boundary.
 */
export function closeFrame(code: number, reason: string, masked: boolean): Buffer {
  let text = Buffer.from(reason, "utf8");
  if (text.length > MAX_CLOSE_REASON) {
    let end = MAX_CLOSE_REASON;
    while (end > 0 && (text[end] & 0xc0) === 0x80) end--; // not inside a UTF-8 sequence
    text = text.subarray(0, end);
  }
  const payload = Buffer.alloc(2 + text.length);
  payload.writeUInt16BE(code, 0);
  text.copy(payload, 2);
  const head = Buffer.from([0x80 | OP_CLOSE, (masked ? 0x80 : 0) | payload.length]);
  if (!masked) return Buffer.concat([head, payload]);
  const mask = randomBytes(4);
  for (let k = 0; k < payload.length; k++) payload[k] ^= mask[k & 3];
  return Buffer.concat([head, mask, payload]);
}
