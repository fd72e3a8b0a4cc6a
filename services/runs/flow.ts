// The two ends of a body sent as frames on NATS with credit, shared by
// streamed answers (stream-wire.ts: runner to gateway) and streamed request
// bodies (body-wire.ts: gateway to runner). The receiver reads frames
// {seq, kind, ...} + bytes on an inbox of its own (FrameInbox) and tells
// the sender how far it has handed them on; the sender stays within
// WINDOW_BYTES of that (CreditInbox).
import { createInbox, type NatsConnection, type Subscription } from "nats";
import { unframe } from "./wire.js";

/** How far a sender may run ahead of what its receiver has handed on. */
export const WINDOW_BYTES = 1024 * 1024;

/**
 * The sender's inbox for credit: `parse` reads a credit message as the
 * total its receiver has handed on (undefined: not one). next() waits for
 * the next message, or close().
 */
export class CreditInbox {
  readonly inbox = createInbox();
  /** The highest total the receiver has reported. */
  credited = 0;
  private readonly sub: Subscription;
  private wake: (() => void) | undefined;

  constructor(nc: NatsConnection, parse: (data: Uint8Array) => number | undefined) {
    this.sub = nc.subscribe(this.inbox, {
      callback: (err, msg) => {
        if (err) return;
        const total = parse(msg.data);
        if (total !== undefined && Number.isFinite(total) && total > this.credited) this.credited = total;
        this.wake?.();
      },
    });
  }

  /** Resolves at the next credit message, or at close(). */
  async next(): Promise<void> {
    await new Promise<void>((resolve) => (this.wake = resolve));
    this.wake = undefined;
  }

  close(): void {
    this.sub.unsubscribe();
    this.wake?.();
  }
}

/**
 * The receiver's inbox: frames in the order they arrive, each checked by
 * `check` (a frame it cannot read comes with meta undefined: its reader
 * takes it as lost, as a gap in seq).
 */
export class FrameInbox<M> {
  readonly inbox = createInbox();
  private readonly sub: Subscription;
  private readonly frames: { meta: M | undefined; body: Uint8Array }[] = [];
  private wake: (() => void) | undefined;
  private last = Date.now();
  private closed = false;

  constructor(
    nc: NatsConnection,
    check: (meta: unknown) => M,
    private readonly silenceMs: number,
  ) {
    this.sub = nc.subscribe(this.inbox, {
      callback: (err, msg) => {
        if (err) return;
        this.last = Date.now();
        try {
          const { meta, body } = unframe<unknown>(msg.data);
          this.frames.push({ meta: check(meta), body });
        } catch {
          this.frames.push({ meta: undefined, body: EMPTY });
        }
        this.wake?.();
      },
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.sub.unsubscribe();
    this.wake?.();
  }

  /** The next frame, or undefined after `silenceMs` without one or once closed. */
  async next(): Promise<{ meta: M | undefined; body: Uint8Array } | undefined> {
    while (this.frames.length === 0) {
      if (this.closed) return undefined;
      const waited = Date.now() - this.last;
      if (waited >= this.silenceMs) return undefined;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, this.silenceMs - waited);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = undefined;
    }
    return this.frames.shift();
  }
}

const EMPTY = new Uint8Array(0);
