// A streamed answer on NATS, from the runner that has the run to the gateway
// that asked (a gateway without a runner of its own). The gateway subscribes
// to an inbox of its own and names it in the request (`stream_to`); the
// runner's reply is the answer's head, which names the runner's credit inbox
// (`credit_to`); the body follows on the gateway's inbox as frames
// {seq, kind} + bytes:
//
//   chunk  the next bytes (a chunk of the app's larger than a NATS message is split)
//   beat   nothing new; sent after HEARTBEAT_MS of silence, so a gateway tells a
//          quiet answer (server-sent events) from a runner that is gone
//   end    the body has ended: {run_time_ms, error?}
//   fail   the run failed after its head: a runner error, as in an error reply
//
// Flow control is by credit: the runner sends at most WINDOW_BYTES past what
// the gateway said it has handed on (the total, published to `credit_to`),
// so a caller that reads slowly slows the app, across NATS too. A gap in
// `seq` (core NATS is at most once) or no frame within SILENCE_MS fails the
// run; a gateway's cancel reaches the runner as any cancel does (control).
import type { NatsConnection } from "nats";
import { Cancelled, ReplicaCrashed } from "./errors.js";
import { CreditInbox, FrameInbox, WINDOW_BYTES } from "./flow.js";
import type { AnswerStream, StreamEnd } from "./invoke.js";
import { checkErrorMeta, frame, runnerError, type ErrorMeta } from "./wire.js";

export { WINDOW_BYTES };
const HEARTBEAT_MS = 5_000;
const SILENCE_MS = 3 * HEARTBEAT_MS;

type StreamMeta =
  | { seq: number; kind: "chunk" | "beat" }
  | { seq: number; kind: "end"; run_time_ms: number; error?: StreamEnd["error"] }
  | ({ seq: number; kind: "fail" } & ErrorMeta);

const EMPTY = new Uint8Array(0);

/** A frame's metadata as declared, else throws (the receiver takes it as a lost frame). */
function checkStreamMeta(meta: unknown): StreamMeta {
  if (typeof meta !== "object" || meta === null || Array.isArray(meta)) throw new Error("not a stream frame");
  const m = meta as Record<string, unknown>;
  if (typeof m.seq !== "number" || !Number.isInteger(m.seq)) throw new Error("stream frame without seq");
  if (m.kind === "chunk" || m.kind === "beat") return m as StreamMeta;
  if (m.kind === "fail") return { ...checkErrorMeta(m), seq: m.seq, kind: "fail" };
  if (m.kind !== "end") throw new Error("stream frame of no known kind");
  const { run_time_ms: ms, error } = m as { run_time_ms: unknown; error: unknown };
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) throw new Error("end frame without run_time_ms");
  if (error !== undefined) {
    const e = error as Record<string, unknown> | null;
    if (typeof e !== "object" || e === null || typeof e.type !== "string" || typeof e.message !== "string")
      throw new Error("end frame with a malformed error");
  }
  return m as StreamMeta;
}

/**
 * The runner's side: sends the body of `stream` to the gateway's inbox, at
 * most WINDOW_BYTES ahead of its credit, in pieces of at most `maxChunk`
 * bytes. Resolves when the body has gone (or failed: the gateway is told).
 */
export class StreamSender {
  private readonly credit: CreditInbox;
  private sent = 0;
  private seq = 0;
  private lastSend = Date.now();

  constructor(
    private readonly nc: NatsConnection,
    private readonly to: string,
    private readonly maxChunk: number,
  ) {
    this.credit = new CreditInbox(nc, (data) => Number(new TextDecoder().decode(data)));
  }

  /** Where the gateway sends credit (the answer's head names it). */
  get creditTo(): string {
    return this.credit.inbox;
  }

  async send(stream: AnswerStream, failed: (err: unknown) => ErrorMeta): Promise<void> {
    const beat = setInterval(() => {
      if (Date.now() - this.lastSend >= HEARTBEAT_MS) this.publish({ seq: 0, kind: "beat" }, EMPTY);
    }, HEARTBEAT_MS);
    try {
      for await (const chunk of stream.chunks) {
        for (let at = 0; at < chunk.byteLength; at += this.maxChunk) {
          const piece = chunk.subarray(at, at + this.maxChunk);
          while (this.sent - this.credit.credited > WINDOW_BYTES) await this.credit.next();
          this.sent += piece.byteLength;
          this.publish({ seq: 0, kind: "chunk" }, piece);
        }
      }
      const end = await stream.ended;
      this.publish(
        { seq: 0, kind: "end", run_time_ms: end.runTimeMs, ...(end.error ? { error: end.error } : {}) },
        EMPTY,
      );
    } catch (err) {
      this.publish({ seq: 0, kind: "fail", ...failed(err) }, EMPTY);
    } finally {
      clearInterval(beat);
      this.credit.close();
    }
  }

  private publish(meta: StreamMeta, body: Uint8Array): void {
    meta.seq = ++this.seq;
    this.lastSend = Date.now();
    this.nc.publish(this.to, frame(meta, body));
  }
}

/**
 * The gateway's side: the inbox a request names as `stream_to`, subscribed
 * before the request goes out. stream() turns it into the answer's body
 * once the head says the answer streams; close() drops it otherwise.
 */
export class StreamReceiver {
  private readonly frames: FrameInbox<StreamMeta>;

  constructor(private readonly nc: NatsConnection) {
    this.frames = new FrameInbox(nc, checkStreamMeta, SILENCE_MS);
  }

  /** The inbox a request names as `stream_to`. */
  get inbox(): string {
    return this.frames.inbox;
  }

  close(): void {
    this.frames.close();
  }

  /** The body that follows the head; `cancel` stops the run (its runner's run is aborted through control). */
  stream(creditTo: string, cancel: () => void): AnswerStream {
    let resolveEnd!: (end: StreamEnd) => void;
    let rejectEnd!: (err: Error) => void;
    const ended = new Promise<StreamEnd>((resolve, reject) => ([resolveEnd, rejectEnd] = [resolve, reject]));
    ended.catch(() => undefined); // the reader, or whoever records the run, sees it
    let stopped = false;
    const stop = () => {
      if (stopped) return;
      stopped = true;
      rejectEnd(new Cancelled());
      this.close();
      cancel();
    };
    const self = this;
    async function* chunks(): AsyncGenerator<Uint8Array> {
      let seq = 0;
      let handed = 0;
      let credited = 0;
      let settled = false;
      try {
        for (;;) {
          const next = await self.frames.next();
          if (stopped) return;
          if (next === undefined) throw new ReplicaCrashed(`the runner sent nothing for ${SILENCE_MS / 1000} s`);
          const { meta, body } = next;
          if (meta === undefined || meta.seq !== ++seq)
            throw new ReplicaCrashed("part of the answer was lost between runner and gateway");
          if (meta.kind === "beat") continue;
          if (meta.kind === "end") {
            settled = true;
            resolveEnd({ runTimeMs: meta.run_time_ms, ...(meta.error ? { error: meta.error } : {}) });
            return;
          }
          if (meta.kind === "fail") throw runnerError(meta);
          yield body;
          handed += body.byteLength;
          if (handed - credited >= WINDOW_BYTES / 4) {
            credited = handed;
            self.nc.publish(creditTo, new TextEncoder().encode(String(handed)));
          }
        }
      } catch (err) {
        settled = true;
        rejectEnd(err as Error);
        throw err;
      } finally {
        if (!settled) stop(); // the reader stopped early: the caller went away
        self.close();
      }
    }
    return { chunks: chunks(), cancel: stop, ended };
  }
}
