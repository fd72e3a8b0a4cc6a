// A caller's request body on NATS as it comes, from the gateway that took the
// call to the runner that has the run (a gateway without a runner of its
// own): the mirror of stream-wire.ts, which carries answers the other way.
// The request names the gateway's credit inbox (`body_stream.credit_to`);
// the runner subscribes to an inbox of its own and publishes {to, credit} to
// it, so no frame goes out before someone listens. The gateway then sends
// the body to `to` as frames {seq, kind} + bytes:
//
//   chunk  the next bytes (at most a NATS message's worth)
//   beat   nothing new; sent after HEARTBEAT_MS of silence (a caller that
//          sends slowly), so the runner tells it from a gateway that is gone
//   end    the body has ended
//   fail   the body broke at the gateway: {reason: "gone" | "too_large", message}
//
// The gateway sends at most WINDOW_BYTES past what the runner said it has
// handed to the replica (`credit`, a running total), so a replica that
// reads slowly slows the caller, across NATS too. A gap in `seq` (core
// NATS is at most once) or no frame within SILENCE_MS fails the body as
// `lost`; the replica is not blamed for any of these (RequestBodyFailed).
import type { NatsConnection } from "nats";
import { ClientGoneError, readWhole, type StreamedRequestBody } from "../server/index.js";
import { RequestBodyFailed } from "./errors.js";
import { CreditInbox, FrameInbox, WINDOW_BYTES } from "./flow.js";
import { frame } from "./wire.js";

export const BODY_HEARTBEAT_MS = 5_000;
const SILENCE_MS = 3 * BODY_HEARTBEAT_MS;

/** What a request frame says of a body that follows it (RequestMeta.body_stream). */
export interface BodyStreamMeta {
  credit_to: string;
  /** The caller's Content-Length, when it declared one. */
  length?: number;
}

type BodyFrame =
  | { seq: number; kind: "chunk" | "beat" | "end" }
  | { seq: number; kind: "fail"; reason: "gone" | "too_large"; message: string };

const EMPTY = new Uint8Array(0);

function checkBodyFrame(meta: unknown): BodyFrame {
  if (typeof meta !== "object" || meta === null || Array.isArray(meta)) throw new Error("not a body frame");
  const m = meta as Record<string, unknown>;
  if (typeof m.seq !== "number" || !Number.isInteger(m.seq)) throw new Error("body frame without seq");
  if (m.kind === "chunk" || m.kind === "beat" || m.kind === "end") return m as BodyFrame;
  if (m.kind === "fail" && (m.reason === "gone" || m.reason === "too_large") && typeof m.message === "string")
    return m as BodyFrame;
  throw new Error("body frame of no known kind");
}

/** A credit message: where the body goes, and how far the runner has handed it on. */
function parseCredit(data: Uint8Array): { to: string; credit: number } | undefined {
  try {
    const m = JSON.parse(new TextDecoder().decode(data)) as { to?: unknown; credit?: unknown };
    if (typeof m.to === "string" && typeof m.credit === "number" && Number.isFinite(m.credit))
      return { to: m.to, credit: m.credit };
  } catch {
    // not one: ignored
  }
  return undefined;
}

/**
 * The gateway's side: sends `body` to the runner once it has said where,
 * in pieces of at most `maxChunk` bytes, within its credit. `failure` holds
 * the body's own error (the caller gone, too large) once it broke; stop()
 * ends the sending (the answer came, or the call failed).
 */
export class BodySender {
  /** The error reading the caller's body raised, if it broke. */
  failure: unknown;
  private readonly credit: CreditInbox;
  private to: string | undefined;
  private sent = 0;
  private seq = 0;
  private stopped = false;
  private lastSend = Date.now();
  readonly done: Promise<void>;

  constructor(
    private readonly nc: NatsConnection,
    private readonly body: StreamedRequestBody,
    private readonly maxChunk: number,
  ) {
    this.credit = new CreditInbox(nc, (data) => {
      const c = parseCredit(data);
      this.to ??= c?.to;
      return c?.credit;
    });
    this.done = this.send();
  }

  /** What the request frame says of this body. */
  get meta(): BodyStreamMeta {
    return { credit_to: this.credit.inbox, ...(this.body.length !== undefined ? { length: this.body.length } : {}) };
  }

  /** Whether a runner has asked for the body (some of it may have gone). */
  get started(): boolean {
    return this.to !== undefined;
  }

  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.credit.close();
  }

  /** Waits until the runner has room (and has said where), or stop(); false once stopped. */
  private async room(): Promise<boolean> {
    while (!this.stopped && (this.to === undefined || this.sent - this.credit.credited >= WINDOW_BYTES))
      await this.credit.next();
    return !this.stopped;
  }

  private async send(): Promise<void> {
    const beat = setInterval(() => {
      if (this.to !== undefined && Date.now() - this.lastSend >= BODY_HEARTBEAT_MS)
        this.publish({ seq: 0, kind: "beat" }, EMPTY);
    }, BODY_HEARTBEAT_MS);
    try {
      if (!(await this.room())) return;
      try {
        for await (const chunk of this.body.chunks()) {
          for (let at = 0; at < chunk.byteLength; at += this.maxChunk) {
            if (!(await this.room())) return;
            const piece = chunk.subarray(at, at + this.maxChunk);
            this.sent += piece.byteLength;
            this.publish({ seq: 0, kind: "chunk" }, piece);
          }
        }
      } catch (err) {
        this.failure = err;
        const reason = err instanceof ClientGoneError ? "gone" : "too_large";
        const message = err instanceof Error ? err.message : String(err);
        if (!this.stopped) this.publish({ seq: 0, kind: "fail", reason, message }, EMPTY);
        return;
      }
      if (!this.stopped) this.publish({ seq: 0, kind: "end" }, EMPTY);
    } finally {
      clearInterval(beat);
    }
  }

  private publish(meta: BodyFrame, bytes: Uint8Array): void {
    meta.seq = ++this.seq;
    this.lastSend = Date.now();
    this.nc.publish(this.to!, frame(meta, bytes));
  }
}

/**
 * The runner's side: the body a request frame announces, as a
 * StreamedRequestBody for the replica. Its inbox is subscribed and the
 * gateway told where to send when chunks() is first read, so a run that
 * never reads its body (refused before it reached a replica) asks for none.
 */
export class BodyReceiver implements StreamedRequestBody {
  readonly length: number | undefined;
  private taken = false;

  constructor(
    private readonly nc: NatsConnection,
    private readonly from: BodyStreamMeta,
  ) {
    this.length = from.length;
  }

  async *chunks(): AsyncGenerator<Uint8Array> {
    if (this.taken) throw new Error("the request body was read already");
    this.taken = true;
    const frames = new FrameInbox(this.nc, checkBodyFrame, SILENCE_MS);
    const credit = (total: number) =>
      this.nc.publish(
        this.from.credit_to,
        new TextEncoder().encode(JSON.stringify({ to: frames.inbox, credit: total })),
      );
    const lost = (why: string) => new RequestBodyFailed(`the request body ${why}`, "lost");
    try {
      credit(0);
      let seq = 0;
      let handed = 0;
      let credited = 0;
      for (;;) {
        const next = await frames.next();
        if (next === undefined) throw lost(`stopped coming for ${SILENCE_MS / 1000} s`);
        const { meta, body } = next;
        if (meta === undefined || meta.seq !== ++seq) throw lost("was cut between gateway and runner");
        if (meta.kind === "beat") continue;
        if (meta.kind === "end") return;
        if (meta.kind === "fail")
          throw new RequestBodyFailed(meta.message, meta.reason === "gone" ? "gone" : "too_large");
        yield body;
        handed += body.byteLength;
        if (handed - credited >= WINDOW_BYTES / 4) credit((credited = handed));
      }
    } finally {
      frames.close();
    }
  }

  read(): Promise<Uint8Array> {
    return readWhole(this.chunks());
  }
}
