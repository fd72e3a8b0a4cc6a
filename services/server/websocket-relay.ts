// One WebSocket connection after its handshake: bytes pass both ways as they
// come, with back-pressure (a side that does not take them stops the other
// from being read), while FrameReaders watch the frames (websocket-frames.ts)
// to count them, to see the close frames, and to stop a caller's message past
// the size limit. skiff closes a connection itself when it goes idle, passes
// its lifetime, carries a message that is too large, or when its owner asks
// (close()): a close frame to each side whose stream is at a frame boundary,
// then an end, then, after CLOSE_WAIT_MS, destruction. An app connection that
// ends without a close frame (its replica died) gets the caller a close frame
// 1011 from skiff.
import type { Duplex } from "node:stream";
import { CLOSE, closeFrame, FrameReader, type CloseFrame } from "./websocket-frames.js";

/** How long the two sides get to finish the closing handshake once skiff closed, before their sockets are destroyed. */
export const CLOSE_WAIT_MS = 1_000;

export type ClosedBy = "caller" | "app" | "skiff";

/** Why skiff closed a connection itself. */
export type SkiffClose = "idle" | "lifetime" | "too_large" | "revoked" | "cancelled" | "shutdown";

export interface RelayEnd {
  /** The first close frame's code (either way), skiff's own, or 1006 when the connection ended without one. */
  closeCode: number;
  closeReason: string;
  /** Who sent that close frame, or whose connection ended first without one. */
  closedBy: ClosedBy;
  /** Set when skiff closed the connection. */
  skiff?: SkiffClose;
  /** The app's connection ended without a close frame from the app (it or its replica stopped). */
  appDropped: boolean;
  /** Bytes of frames from the caller to the app, and back. */
  bytesIn: number;
  bytesOut: number;
  /** Whole data messages each way. */
  messagesIn: number;
  messagesOut: number;
  durationMs: number;
}

export interface RelayOptions {
  /** Largest message from the caller; a larger one closes the connection with 1009. */
  maxMessageBytes: number;
  /** A connection with no bytes either way for this long is closed with 1001. */
  idleTimeoutMs: number;
  /** A connection open this long is closed with 1008 (an app's response_grace_period). */
  lifetimeMs: number;
  /** Words of the close reasons, naming what the caller may change (a setting). */
  reasons?: Partial<Record<"idle" | "lifetime" | "too_large", string>>;
  /** Bytes the caller sent after its handshake, and the app after its 101 answer. */
  callerHead?: Buffer;
  appHead?: Buffer;
}

export class WebSocketRelay {
  /** Settles once both sides are closed. */
  readonly ended: Promise<RelayEnd>;
  private settle!: (end: RelayEnd) => void;
  private readonly up: FrameReader;
  private readonly down = new FrameReader();
  private readonly started = performance.now();
  private lastActivity = performance.now();
  private first: (CloseFrame & { by: ClosedBy }) | undefined;
  private firstGone: ClosedBy | undefined;
  private closing: { kind: SkiffClose; code: number; reason: string } | undefined;
  private callerClosed = false;
  private appClosed = false;
  private appDropped = false;
  /** The app's end was passed on to the caller. */
  private appEnd = false;
  /** The caller's input ended (its end was passed on to the app). */
  private callerEnd = false;
  private readonly timers: NodeJS.Timeout[] = [];
  private done = false;

  constructor(
    private readonly caller: Duplex,
    private readonly app: Duplex,
    private readonly opts: RelayOptions,
  ) {
    this.ended = new Promise((resolve) => (this.settle = resolve));
    this.up = new FrameReader({ maxMessageBytes: opts.maxMessageBytes });
    caller.on("error", () => {});
    app.on("error", () => {});
    caller.on("data", (chunk: Buffer) => this.fromCaller(chunk));
    app.on("data", (chunk: Buffer) => this.fromApp(chunk));
    caller.on("drain", () => app.resume());
    app.on("drain", () => caller.resume());
    // A half-close passes on, as the relay in the sandbox does.
    caller.on("end", () => {
      this.callerEnd = true;
      this.firstGone ??= "caller";
      if (!this.closing) app.end();
    });
    app.on("end", () => this.appEnded());
    caller.once("close", () => this.callerGone());
    app.once("close", () => this.appGone());
    this.timers.push(setTimeout(() => this.checkIdle(), opts.idleTimeoutMs));
    this.timers.push(
      setTimeout(
        () => this.close("lifetime", CLOSE.POLICY_VIOLATION, opts.reasons?.lifetime ?? "connection lifetime reached"),
        opts.lifetimeMs,
      ),
    );
    for (const t of this.timers) t.unref();
    if (opts.appHead?.length) this.fromApp(opts.appHead);
    if (opts.callerHead?.length) this.fromCaller(opts.callerHead);
  }

  private fromCaller(chunk: Buffer): void {
    if (this.closing) return; // skiff has closed: what follows is read and dropped
    this.lastActivity = performance.now();
    const { forward, tooLarge } = this.up.read(chunk);
    if (this.up.close && !this.first) this.first = { ...this.up.close, by: "caller" };
    // Once the app's side has ended, what the caller still sends (its answer to a close frame) goes nowhere.
    let flowing = true;
    if (!this.app.writableEnded) for (const b of forward) flowing = this.app.write(b) && flowing;
    if (!flowing) this.caller.pause();
    if (tooLarge)
      this.close(
        "too_large",
        CLOSE.MESSAGE_TOO_BIG,
        this.opts.reasons?.too_large ?? `message larger than ${tooLarge.limit} bytes`,
      );
  }

  private fromApp(chunk: Buffer): void {
    if (this.closing) return;
    this.lastActivity = performance.now();
    const { forward } = this.down.read(chunk);
    if (this.down.close && !this.first) this.first = { ...this.down.close, by: "app" };
    let flowing = true;
    if (!this.caller.writableEnded) for (const b of forward) flowing = this.caller.write(b) && flowing;
    if (!flowing) this.app.pause();
  }

  private checkIdle(): void {
    const quiet = performance.now() - this.lastActivity;
    if (quiet >= this.opts.idleTimeoutMs)
      return this.close("idle", CLOSE.GOING_AWAY, this.opts.reasons?.idle ?? "idle connection closed");
    const t = setTimeout(() => this.checkIdle(), this.opts.idleTimeoutMs - quiet);
    t.unref();
    this.timers.push(t);
  }

  /**
   * Closes the connection from skiff: a close frame to each side that is
   * still open and whose stream is at a frame boundary, then an end; both
   * sockets are destroyed after CLOSE_WAIT_MS at the latest. Only the first
   * call counts.
   */
  close(kind: SkiffClose, code: number, reason: string): void {
    if (this.closing || this.done) return;
    this.closing = { kind, code, reason };
    if (!this.callerClosed) {
      if (this.down.atBoundary) this.caller.write(closeFrame(code, reason, false));
      this.caller.end();
      this.caller.resume();
    }
    if (!this.appClosed) {
      if (this.up.atBoundary) this.app.write(closeFrame(code, reason, true));
      this.app.end();
      this.app.resume();
    }
    this.destroyLater();
  }

  private destroyLater(): void {
    const t = setTimeout(() => {
      this.caller.destroy();
      this.app.destroy();
    }, CLOSE_WAIT_MS);
    t.unref();
    this.timers.push(t);
  }

  private callerGone(): void {
    this.callerClosed = true;
    this.firstGone ??= "caller";
    if (!this.appClosed) {
      this.app.end();
      this.destroyLater();
    }
    this.finish();
  }

  /** The app's input ended (or its connection closed): the caller's ends too. */
  private appEnded(): void {
    if (this.appEnd || this.closing || this.callerClosed) return;
    this.appEnd = true;
    if (!this.down.close && !this.up.close && !this.callerEnd) {
      // The app's side ended without a close frame, unasked: its replica (or its relay) is gone.
      this.appDropped = true;
      if (this.down.atBoundary)
        this.caller.write(closeFrame(CLOSE.INTERNAL_ERROR, "the app's connection ended without a close frame", false));
    }
    this.caller.end();
  }

  private appGone(): void {
    this.appClosed = true;
    this.firstGone ??= "app";
    if (!this.callerClosed && !this.closing) {
      this.appEnded();
      this.destroyLater();
    }
    this.finish();
  }

  private finish(): void {
    if (!this.callerClosed || !this.appClosed || this.done) return;
    this.done = true;
    for (const t of this.timers) clearTimeout(t);
    const closed = this.closing
      ? { closeCode: this.closing.code, closeReason: this.closing.reason, closedBy: "skiff" as const }
      : this.appDropped
        ? { closeCode: CLOSE.ABNORMAL, closeReason: "", closedBy: "app" as const }
        : this.first
          ? { closeCode: this.first.code, closeReason: this.first.reason, closedBy: this.first.by }
          : { closeCode: CLOSE.ABNORMAL, closeReason: "", closedBy: this.firstGone ?? "caller" };
    this.settle({
      ...closed,
      ...(this.closing ? { skiff: this.closing.kind } : {}),
      appDropped: this.appDropped,
      bytesIn: this.up.bytes,
      bytesOut: this.down.bytes,
      messagesIn: this.up.messages,
      messagesOut: this.down.messages,
      durationMs: Math.round(performance.now() - this.started),
    });
  }
}
