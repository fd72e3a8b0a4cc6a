// The one byte stream between a gateway and a runner: a Node Duplex on each
// side over a pair of core NATS subjects (`skiff.stream.{id}.up` from the
// gateway, `.down` back). A run's streamed request body goes up, its streamed
// answer comes down, and a WebSocket's bytes go both ways, all on this.
//
// Every message is a stream frame (codec.ts): kind, the sender's sequence
// number (every message a side sends counts, so a lost one shows as a gap),
// and a payload:
//
//   CREDIT n      the receiver takes n more bytes. A side sends no bytes and no END before its
//                 peer's first credit, which says the peer listens; then never more than it has
//                 been granted (WINDOW_BYTES ahead of what the reader took), so a slow reader
//                 slows the writer at the other end
//   DATA   bytes  at most `chunkBytes`
//   END    trailer  no more bytes this way (a half-close); the trailer says how they ended (may be empty)
//   ABORT  reason   the sender's side is gone: the receiver is destroyed, with StreamAborted(reason)
//                 when there is a reason (a run's error), else without an error
//   PING          sent to a peer that is there when nothing else went out for a heartbeat
//
// A side checks its peer's liveness once it knows the peer is there (it heard
// from it, or expectPeer() says so): three heartbeats without a message
// destroy it with StreamSilent. Those are heartbeats this side lived through,
// each judged after reading what had come: a process whose own event loop
// stalled (load, a long GC) finds the peer's messages still unread when its
// timer fires, and does not take the peer for gone for its own stall. A
// destroyed side tells its peer (ABORT), unless both ways ended in order or
// the peer never was there.
import { Duplex } from "node:stream";
import type { NatsConnection, Subscription } from "nats";
import { decodeStreamFrame, encodeStreamFrame, StreamKind } from "./codec.js";

/** Bytes a writer may send past what its reader has taken. */
export const WINDOW_BYTES = 1024 * 1024;
/** The largest payload of one DATA message. */
export const CHUNK_BYTES = 64 * 1024;
export const HEARTBEAT_MS = 5_000;
/** Heartbeats a peer may miss before the stream is given up. */
const MISSED_HEARTBEATS = 3;

/** The peer went away with a reason (the runner's error, or why the caller's body broke). */
export class StreamAborted extends Error {
  override readonly name = "StreamAborted";
  constructor(readonly reason: Uint8Array) {
    super("the other end of the stream gave up");
  }
}

/** Nothing came from the peer for MISSED_HEARTBEATS heartbeats: its process is taken for gone. */
export class StreamSilent extends Error {
  override readonly name = "StreamSilent";
  constructor(readonly silentMs: number) {
    super(`the other end of the stream went silent (nothing for ${Math.round(silentMs / 1000)} s)`);
  }
}

/** A message of the stream did not arrive (core NATS is at most once). */
export class StreamBroken extends Error {
  override readonly name = "StreamBroken";
}

export interface ByteStreamOptions {
  nc: NatsConnection;
  /** The subject this side publishes to, and the one it hears; the other side has them swapped. */
  send: string;
  receive: string;
  /** The peer listens already (it made its side before this one): its liveness is checked from the start. */
  peerListening?: boolean;
  heartbeatMs?: number;
  chunkBytes?: number;
}

export class ByteStream extends Duplex {
  /** What the peer's END said of how its bytes ended (set once the readable side has ended). */
  trailer: Uint8Array | undefined;
  private readonly nc: NatsConnection;
  private readonly sendTo: string;
  private readonly sub: Subscription;
  private readonly heartbeatMs: number;
  private readonly chunkBytes: number;
  /** Heartbeats, from when the peer is known to be there. */
  private timer: NodeJS.Timeout | undefined;
  private seqOut = 0;
  private seqIn: number | undefined;
  /** Bytes the peer still takes. */
  private credit = 0;
  private wake: (() => void) | undefined;
  private granted = false;
  /** Bytes taken by the reader, not yet credited back. */
  private taken = 0;
  /** Bytes pushed while the reader's buffer was full: credited when it reads again. */
  private held = 0;
  private creditScheduled = false;
  private lastSent = Date.now();
  private lastHeard = Date.now();
  /** Whether the peer spoke since the last judgment of silence, and how many judgments in a row found it had not. */
  private heardSinceJudgment = false;
  private missed = 0;
  /** The peer is there: it spoke, or expectPeer() said so. */
  private peerKnown: boolean;
  private peerGone = false;
  private contacted = false;
  private abortReason: Uint8Array | undefined;
  private trailerOut: Uint8Array | undefined;
  /** Settles at the peer's first credit (true), or when this side is destroyed first (false). */
  readonly contact: Promise<boolean>;
  private settleContact!: (ok: boolean) => void;

  constructor(opts: ByteStreamOptions) {
    super({ allowHalfOpen: true });
    this.nc = opts.nc;
    this.sendTo = opts.send;
    this.heartbeatMs = opts.heartbeatMs ?? HEARTBEAT_MS;
    this.chunkBytes = opts.chunkBytes ?? CHUNK_BYTES;
    this.peerKnown = opts.peerListening ?? false;
    this.contact = new Promise((resolve) => (this.settleContact = resolve));
    // Its errors reach its readers (iterators, 'close', `errored`): an error with no listener must not end the process.
    this.on("error", () => undefined);
    this.sub = opts.nc.subscribe(opts.receive, { callback: (err, msg) => err || this.heard(msg.data) });
    if (this.peerKnown) this.startBeating();
  }

  private startBeating(): void {
    if (this.timer !== undefined || this.destroyed) return;
    this.timer = setInterval(() => this.beat(), this.heartbeatMs);
    this.timer.unref();
  }

  /** Whether the peer has granted credit (asked for bytes) yet. */
  get started(): boolean {
    return this.contacted;
  }

  /** The peer is known to be there from now on (its answer came): its silence counts from here. */
  expectPeer(): void {
    if (this.peerKnown) return;
    this.peerKnown = true;
    this.lastHeard = Date.now();
    this.startBeating();
  }

  /** Ends this side's bytes with a trailer the peer reads as `trailer`. */
  finish(trailer: Uint8Array, callback?: () => void): void {
    this.trailerOut = trailer;
    this.end(callback);
  }

  /** Destroys this side and tells the peer why (it is destroyed with StreamAborted(reason)). */
  abort(reason: Uint8Array): void {
    this.abortReason = reason;
    this.destroy();
  }

  /** Destroys this side without a word to the peer (nothing it sends is needed any more). */
  detach(): void {
    this.peerGone = true;
    this.destroy();
  }

  private publish(kind: StreamKind, payload?: Uint8Array): void {
    this.lastSent = Date.now();
    this.seqOut = (this.seqOut + 1) >>> 0;
    try {
      this.nc.publish(this.sendTo, encodeStreamFrame(kind, this.seqOut, payload));
    } catch (err) {
      // The connection is closed: the stream cannot go on (while destroying, there is nothing left to tell).
      if (!this.destroyed) this.destroy(err as Error);
    }
  }

  private beat(): void {
    // Only once the peer is there (a gateway waiting for its reply neither pings nor counts silence).
    if (Date.now() - this.lastSent >= this.heartbeatMs) this.publish(StreamKind.Ping);
    // Timers run before the socket is read: judged once what has already come is read.
    setImmediate(() => this.judgeSilence());
  }

  private judgeSilence(): void {
    if (this.destroyed) return;
    this.missed = this.heardSinceJudgment ? 0 : this.missed + 1;
    this.heardSinceJudgment = false;
    const silent = Date.now() - this.lastHeard;
    if (this.missed >= MISSED_HEARTBEATS && silent > this.heartbeatMs * MISSED_HEARTBEATS)
      this.destroy(new StreamSilent(silent));
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (err?: Error | null) => void): void {
    this.sendAll(chunk).then(() => callback(), callback);
  }

  private async sendAll(chunk: Uint8Array): Promise<void> {
    for (let at = 0; at < chunk.byteLength;) {
      while (this.credit <= 0 && !this.destroyed) await new Promise<void>((resolve) => (this.wake = resolve));
      if (this.destroyed) return;
      const n = Math.min(chunk.byteLength - at, this.chunkBytes, this.credit);
      this.publish(StreamKind.Data, chunk.subarray(at, at + n));
      this.credit -= n;
      at += n;
    }
  }

  override _final(callback: (err?: Error | null) => void): void {
    // An END sent before the peer listens would be lost: it waits for the peer's first credit.
    void this.contact.then((ok) => {
      if (ok && !this.destroyed) this.publish(StreamKind.End, this.trailerOut);
      callback();
    });
  }

  override _read(): void {
    if (!this.granted) {
      // The first read: the peer may send a window's worth (which also tells it this side listens).
      this.granted = true;
      this.publishCredit(WINDOW_BYTES);
    }
    if (this.held === 0) return;
    this.taken += this.held;
    this.held = 0;
    this.flushCredit();
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    const inOrder = this.writableFinished && this.readableEnded;
    if (this.abortReason !== undefined || (this.peerKnown && !this.peerGone && !inOrder))
      this.publish(StreamKind.Abort, this.abortReason);
    if (!this.nc.isClosed()) this.sub.unsubscribe();
    clearInterval(this.timer);
    this.settleContact(false);
    this.wake?.();
    callback(err);
  }

  private heard(data: Uint8Array): void {
    if (this.destroyed) return;
    this.lastHeard = Date.now();
    this.heardSinceJudgment = true;
    if (!this.peerKnown) {
      this.peerKnown = true;
      this.startBeating();
    }
    let message;
    try {
      message = decodeStreamFrame(data);
    } catch {
      return void this.destroy(new StreamBroken("a message of the stream cannot be read"));
    }
    const { kind, seq, payload } = message;
    // The first message heard sets the count: those sent before this side listened are not missed.
    if (this.seqIn !== undefined && seq !== this.seqIn)
      return void this.destroy(new StreamBroken("a message of the stream was lost"));
    this.seqIn = (seq + 1) >>> 0;
    switch (kind) {
      case StreamKind.Data: {
        const bytes = Buffer.from(payload); // a copy: the client may reuse what it read into
        if (this.push(bytes)) {
          this.taken += bytes.length;
          this.scheduleCredit();
        } else this.held += bytes.length;
        return;
      }
      case StreamKind.Credit: {
        if (payload.byteLength < 4) return void this.destroy(new StreamBroken("a credit message without its count"));
        this.credit += new DataView(payload.buffer, payload.byteOffset, 4).getUint32(0);
        if (!this.contacted) {
          this.contacted = true;
          this.settleContact(true);
        }
        const wake = this.wake;
        this.wake = undefined;
        wake?.();
        return;
      }
      case StreamKind.End:
        this.trailer = payload;
        this.push(null);
        return;
      case StreamKind.Abort:
        this.peerGone = true;
        this.destroy(payload.byteLength > 0 ? new StreamAborted(payload) : undefined);
        return;
      case StreamKind.Ping:
        return;
    }
  }

  /** Credit goes back in batches: at once past a quarter window, else on the next turn of the loop. */
  private scheduleCredit(): void {
    if (this.taken >= WINDOW_BYTES / 4) return this.flushCredit();
    if (this.creditScheduled) return;
    this.creditScheduled = true;
    setImmediate(() => {
      this.creditScheduled = false;
      this.flushCredit();
    });
  }

  private flushCredit(): void {
    if (this.taken === 0 || this.destroyed) return;
    const n = this.taken;
    this.taken = 0;
    this.publishCredit(n);
  }

  private publishCredit(n: number): void {
    const payload = new Uint8Array(4);
    new DataView(payload.buffer).setUint32(0, n);
    this.publish(StreamKind.Credit, payload);
  }
}
