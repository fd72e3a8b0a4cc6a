// The protobuf binary of a `skiff.events.v1.RunEvent`, written straight from
// a run record: the same bytes as toBinary(RunEventSchema, runEvent(...))
// (fields in number order, proto3 defaults left out), without building the
// message object and walking it by reflection: every state change of every
// run publishes one. test/runs/event-bytes.test.ts holds the two equal.
import type { RunRecord } from "./store.js";

/** The response body of a terminal event: inline, or an object in `skiff-results`. */
export type EventResponse = { contentType: string; data: Uint8Array } | { object: string } | undefined;

/**
 * Writes into one buffer that every event reuses (an event is written in one
 * synchronous call), grown when an event needs more; `done` copies the event
 * out. A nested message reserves one byte for its length and moves its bytes
 * when the length takes more.
 */
class Writer {
  private static shared = Buffer.allocUnsafe(4096);
  buf = Writer.shared;
  pos = 0;

  private room(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const grown = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.pos + n));
    this.buf.copy(grown, 0, 0, this.pos);
    this.buf = Writer.shared = grown;
  }

  varint(value: number): void {
    this.room(10);
    // A negative int32 is sign-extended to 64 bits: ten bytes.
    if (value < 0) {
      let big = BigInt.asUintN(64, BigInt(value));
      while (big > 0x7fn) {
        this.buf[this.pos++] = Number(big & 0x7fn) | 0x80;
        big >>= 7n;
      }
      this.buf[this.pos++] = Number(big);
      return;
    }
    while (value > 0x7f) {
      this.buf[this.pos++] = (value % 0x80) | 0x80;
      value = Math.floor(value / 0x80);
    }
    this.buf[this.pos++] = value;
  }

  tag(field: number, wireType: number): void {
    this.varint(field * 8 + wireType);
  }

  bytes(field: number, data: Uint8Array): void {
    this.tag(field, 2);
    this.varint(data.length);
    this.room(data.length);
    this.buf.set(data, this.pos);
    this.pos += data.length;
  }

  /** A string field; left out when empty, as proto3 does. */
  string(field: number, text: string | undefined): void {
    if (!text) return;
    const size = Buffer.byteLength(text, "utf8");
    this.tag(field, 2);
    this.varint(size);
    this.room(size);
    this.pos += this.buf.write(text, this.pos, size, "utf8");
  }

  bool(field: number, value: boolean | undefined): void {
    if (!value) return;
    this.tag(field, 0);
    this.varint(1);
  }

  uint(field: number, value: number): void {
    if (value === 0) return;
    this.tag(field, 0);
    this.varint(value);
  }

  double(field: number, value: number): void {
    if (value === 0) return;
    this.tag(field, 1);
    this.room(8);
    this.buf.writeDoubleLE(value, this.pos);
    this.pos += 8;
  }

  /** A message field, written by `write` after a length that is set once its size is known. */
  message(field: number, write: (w: Writer) => void): void {
    this.tag(field, 2);
    this.room(1);
    const at = this.pos++;
    write(this);
    const size = this.pos - at - 1;
    if (size < 0x80) {
      this.buf[at] = size;
      return;
    }
    // The length takes more than the byte kept for it: the message moves up to make room.
    let lengthBytes = 1;
    for (let v = size; v > 0x7f; v = Math.floor(v / 0x80)) lengthBytes++;
    this.room(lengthBytes - 1);
    this.buf.copyWithin(at + lengthBytes, at + 1, this.pos);
    this.pos = at;
    this.varint(size);
    this.pos += size;
  }

  done(): Uint8Array {
    const out = new Uint8Array(this.pos);
    out.set(this.buf.subarray(0, this.pos));
    return out;
  }
}

/** The event of the record's current state, carrying the response of a terminal one inline or by object name. */
export function runEventBytes(record: RunRecord, response: EventResponse): Uint8Array {
  const w = new Writer();
  w.string(1, record.run_id);
  w.string(2, record.project_id);
  w.string(3, record.app_name);
  w.string(4, record.path);
  w.bool(5, record.async);
  w.string(6, record.status);
  const ms = new Date(record.finished_at ?? record.started_at ?? record.queued_at).getTime();
  w.message(7, (t) => {
    t.uint(1, Math.floor(ms / 1000));
    t.uint(2, (ms % 1000) * 1_000_000);
  });
  w.uint(8, Math.max(1, record.attempts));
  w.double(9, record.run_time_ms ?? 0);
  const statusCode = record.status_code ?? 0;
  if (statusCode !== 0) {
    w.tag(10, 0);
    w.varint(statusCode | 0);
  }
  const error = record.error;
  if (error) {
    w.message(11, (e) => {
      e.string(1, error.type);
      e.string(2, error.message);
    });
  }
  w.string(12, record.webhook_endpoint);
  w.bool(13, record.webhook_signed);
  if (response && "object" in response) w.string(15, response.object);
  else if (response) {
    w.message(14, (b) => {
      b.string(1, response.contentType);
      if (response.data.length > 0) b.bytes(2, response.data);
    });
  }
  return w.done();
}
