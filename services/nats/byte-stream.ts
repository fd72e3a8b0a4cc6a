// A byte stream between two processes over a pair of core NATS subjects:
// a Node Duplex on each side, with flow control, half-close and liveness.
// A WebSocket that a gateway takes for an app whose replicas are on another
// process's runner travels this way (invocation/websocket.ts, runner/ws-dispatch.ts).
//
//   const stream = new NatsByteStream({ nc, send: "x.up", receive: "x.down" }); // the other side swaps them
//   socket.pipe(stream).pipe(socket);
//
// Messages (the first byte says which):
//   DATA  seq (u32) + bytes   at most CHUNK_BYTES; seq counts from 0, a gap (a lost message) breaks the stream
//   ACK   n (u32)             the receiver took n more bytes: its sender may have WINDOW_BYTES unacknowledged
//   END                        no more bytes this way (a half-close)
//   ABORT                      the sender's side is gone: the receiver's is destroyed
//   PING                       sent when nothing else went out for a heartbeat; a side silent for
//                              three heartbeats is destroyed with an error
// Acknowledgements are withheld while the reader does not take the bytes
// (its buffer is full), so a slow reader slows the writer at the other end.
import { Duplex } from "node:stream";
import type { NatsConnection, Subscription } from "nats";

const DATA = 1;
const ACK = 2;
const END = 3;
const ABORT = 4;
const PING = 5;

/** Bytes in flight before a write waits for acknowledgements. */
export const WINDOW_BYTES = 1024 * 1024;
/** Largest payload of one DATA message. */
export const CHUNK_BYTES = 64 * 1024;
export const HEARTBEAT_MS = 5_000;
/** Heartbeats a peer may miss before the stream is given up. */
const MISSED_HEARTBEATS = 3;

export interface NatsByteStreamOptions {
  nc: NatsConnection;
  /** The subject this side publishes to, and the one it hears; the other side has them swapped. */
  send: string;
  receive: string;
  heartbeatMs?: number;
}

export class NatsByteStream extends Duplex {
  private readonly nc: NatsConnection;
  private readonly sendTo: string;
  private readonly sub: Subscription;
  private readonly heartbeatMs: number;
  private readonly timer: NodeJS.Timeout;
  private seqOut = 0;
  private seqIn = 0;
  private inFlight = 0;
  private waiting: (() => void) | undefined;
  /** Bytes taken by the reader, not yet acknowledged. */
  private taken = 0;
  /** Bytes pushed while the reader's buffer was full: acknowledged when it reads again. */
  private held = 0;
  private ackScheduled = false;
  private lastSent = Date.now();
  private lastHeard = Date.now();
  private peerGone = false;

  constructor(opts: NatsByteStreamOptions) {
    super({ allowHalfOpen: true });
    this.nc = opts.nc;
    this.sendTo = opts.send;
    this.heartbeatMs = opts.heartbeatMs ?? HEARTBEAT_MS;
    this.sub = opts.nc.subscribe(opts.receive, { callback: (err, msg) => err || this.heard(msg.data) });
    this.timer = setInterval(() => this.beat(), this.heartbeatMs);
    this.timer.unref();
  }

  private publish(type: number, body?: Uint8Array, seq?: number): void {
    const head = seq === undefined ? 1 : 5;
    const msg = new Uint8Array(head + (body?.length ?? 0));
    msg[0] = type;
    if (seq !== undefined) new DataView(msg.buffer).setUint32(1, seq);
    if (body) msg.set(body, head);
    this.lastSent = Date.now();
    try {
      this.nc.publish(this.sendTo, msg);
    } catch (err) {
      // The connection is closed: the stream cannot go on (while destroying, there is nothing left to tell).
      if (!this.destroyed) this.destroy(err as Error);
    }
  }

  private beat(): void {
    if (Date.now() - this.lastHeard > this.heartbeatMs * MISSED_HEARTBEATS)
      return void this.destroy(new Error("the other end of the stream went silent"));
    if (Date.now() - this.lastSent >= this.heartbeatMs) this.publish(PING);
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (err?: Error | null) => void): void {
    for (let at = 0; at < chunk.length; at += CHUNK_BYTES) {
      const piece = chunk.subarray(at, at + CHUNK_BYTES);
      this.publish(DATA, piece, this.seqOut++);
      this.inFlight += piece.length;
    }
    if (this.inFlight <= WINDOW_BYTES) callback();
    else this.waiting = callback;
  }

  override _final(callback: (err?: Error | null) => void): void {
    this.publish(END);
    callback();
  }

  override _read(): void {
    if (this.held === 0) return;
    this.taken += this.held;
    this.held = 0;
    this.flushAck();
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    // Both ways ended in order: nothing to abort (the peer may still be reading what came before its END).
    if (!this.peerGone && !(this.writableFinished && this.readableEnded)) this.publish(ABORT);
    if (!this.nc.isClosed()) this.sub.unsubscribe();
    clearInterval(this.timer);
    this.waiting = undefined;
    callback(err);
  }

  private heard(data: Uint8Array): void {
    this.lastHeard = Date.now();
    const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
    switch (data[0]) {
      case DATA: {
        if (data.length < 5 || view.getUint32(1) !== this.seqIn++)
          return void this.destroy(new Error("a message of the stream was lost"));
        const bytes = Buffer.from(data.subarray(5)); // a copy: the client may reuse what it read into
        if (this.push(bytes)) {
          this.taken += bytes.length;
          this.scheduleAck();
        } else this.held += bytes.length;
        return;
      }
      case ACK: {
        if (data.length < 5) return;
        this.inFlight -= view.getUint32(1);
        const waiting = this.waiting;
        if (waiting && this.inFlight <= WINDOW_BYTES) {
          this.waiting = undefined;
          waiting();
        }
        return;
      }
      case END:
        this.push(null);
        return;
      case ABORT:
        this.peerGone = true;
        this.destroy();
        return;
    }
  }

  /** Acknowledgements go out in batches: at once past a quarter window, else on the next turn of the loop. */
  private scheduleAck(): void {
    if (this.taken >= WINDOW_BYTES / 4) return this.flushAck();
    if (this.ackScheduled) return;
    this.ackScheduled = true;
    setImmediate(() => {
      this.ackScheduled = false;
      this.flushAck();
    });
  }

  private flushAck(): void {
    if (this.taken === 0 || this.destroyed) return;
    const n = new Uint8Array(4);
    new DataView(n.buffer).setUint32(0, this.taken);
    this.taken = 0;
    this.publish(ACK, n);
  }
}
