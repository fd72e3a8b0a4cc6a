// Acknowledged JetStream publishes, pipelined on one reply subscription per
// connection. nats.js's js.publish() is a request: a reply subscription entry
// and a timer per publish, and, once the acknowledgement arrived, an error
// object (with its stack trace) made only to cancel the finished request:
// about 3% of the async accept path's CPU. Here every publish of a
// connection gets its reply on `{inbox}.{n}` of one wildcard subscription,
// and one sweep a second fails the publishes that waited too long. Plain
// requests (a KV record read from its stream's leader, kv-get.ts) share the
// same subscription, and so do confirmed acks of consumed messages
// (confirmAck: nats.js's ackAck() makes a request entry, a timer, an error
// for its async trace and another to cancel the finished request, per ack).
import {
  createInbox,
  MsgHdrsImpl,
  type JsMsg,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
  type Subscription,
} from "nats";
import { beforeDrain } from "./coalesce.js";

/** JetStream's acknowledgement of a stored message. */
interface PubAck {
  stream: string;
  seq: number;
  /** The message repeated a Nats-Msg-Id still in the stream's duplicate window: it was not stored again. */
  duplicate: boolean;
}

/** JetStream refused the message (its answer's code and description), or no stream took it, or no answer came. */
export class PublishError extends Error {
  override name = "PublishError";
  constructor(
    message: string,
    /** JetStream's err_code, when it gave one. */
    readonly apiCode?: number,
  ) {
    super(message);
  }
}

export interface PublishOptions {
  /** Nats-Msg-Id: a repeat within the stream's duplicate window is not stored again. */
  msgId?: string;
  /** Stored only if the subject's last message has this sequence (0: the subject has none): a compare-and-set. */
  expectedLastSubjectSequence?: number;
  /** Headers of the message's own. */
  headers?: MsgHdrs;
}

/** How long a publish waits for its acknowledgement, as nats.js's default. */
const PUBLISH_TIMEOUT_MS = 5_000;
const SWEEP_MS = 1_000;
const decoder = new TextDecoder();
const encoder = new TextEncoder();

interface Waiting {
  /** The answer arrived (not "no responders"). */
  settle(msg: Msg): void;
  reject(err: Error): void;
  subject: string;
  /** What the timeout's error names: an acknowledgement, or any answer. */
  awaits: "acknowledgement" | "answer";
  sentAt: number;
}

/** One connection's publisher; publishAcked() keeps one per connection. */
export class AckedPublisher {
  private readonly inbox = createInbox();
  private readonly waiting = new Map<string, Waiting>();
  private next = 0;
  private readonly sub: Subscription;
  private readonly sweeper: ReturnType<typeof setInterval>;

  constructor(
    private readonly nc: NatsConnection,
    private readonly timeoutMs: number,
  ) {
    this.sub = nc.subscribe(`${this.inbox}.*`, {
      callback: (err, msg) => (err ? this.failAll(err) : this.answer(msg)),
    });
    // Timers run before the socket is read: after a stall of this process's event loop, the answers that came
    // meanwhile are read first (setImmediate), and only what is still unanswered has timed out.
    this.sweeper = setInterval(() => setImmediate(() => this.sweep()), SWEEP_MS);
    this.sweeper.unref();
    void nc.closed().then(() => this.failAll(new PublishError("the NATS connection closed")));
    // A drain waits for the answers still owed (nats.js reads none once it has begun).
    beforeDrain(nc, () => this.waiting.size > 0);
  }

  publish(subject: string, data: Uint8Array, opts: PublishOptions = {}): Promise<PubAck> {
    let h = opts.headers;
    if (opts.msgId !== undefined || opts.expectedLastSubjectSequence !== undefined) {
      h ??= new MsgHdrsImpl();
      if (opts.msgId !== undefined) setHeader(h, "Nats-Msg-Id", opts.msgId);
      if (opts.expectedLastSubjectSequence !== undefined)
        setHeader(h, "Nats-Expected-Last-Subject-Sequence", String(opts.expectedLastSubjectSequence));
    }
    return new Promise<PubAck>((resolve, reject) => {
      this.send(subject, data, h, {
        settle: (msg) => settleAck(msg, subject, resolve, reject),
        reject,
        subject,
        awaits: "acknowledgement",
        sentAt: 0,
      });
    });
  }

  /**
   * A request whose answer is the message itself (headers and status
   * included); rejected with a PublishError on "no responders" or when no
   * answer comes within the timeout.
   */
  request(subject: string, data: Uint8Array, h?: MsgHdrs): Promise<Msg> {
    return new Promise<Msg>((resolve, reject) =>
      this.send(subject, data, h, { settle: resolve, reject, subject, awaits: "answer", sentAt: 0 }),
    );
  }

  /** Sends and waits for the answer (`w`'s sentAt is set here). */
  private send(subject: string, data: Uint8Array, h: MsgHdrs | undefined, w: Waiting): void {
    const token = String(++this.next);
    w.sentAt = Date.now();
    this.waiting.set(token, w);
    try {
      const reply = `${this.inbox}.${token}`;
      this.nc.publish(subject, data, h ? { reply, headers: h } : { reply });
    } catch (err) {
      this.waiting.delete(token);
      w.reject(err as Error);
    }
  }

  private answer(msg: Msg): void {
    const token = msg.subject.slice(this.inbox.length + 1);
    const w = this.waiting.get(token);
    if (w === undefined) return; // it timed out already
    this.waiting.delete(token);
    // Nothing listens on the subject: the server answers "no responders" (503, no payload).
    if (msg.data.length === 0 && msg.headers?.code === 503) {
      const why = w.awaits === "acknowledgement" ? " (no JetStream stream takes it)" : "";
      w.reject(new PublishError(`nothing answers on ${w.subject}${why}`));
      return;
    }
    w.settle(msg);
  }

  private sweep(): void {
    const deadline = Date.now() - this.timeoutMs;
    for (const [token, w] of this.waiting) {
      if (w.sentAt > deadline) break; // in the order they were sent
      this.waiting.delete(token);
      w.reject(new PublishError(`no ${w.awaits} to a message on ${w.subject} within ${this.timeoutMs} ms`));
    }
  }

  private failAll(err: Error): void {
    clearInterval(this.sweeper);
    for (const w of this.waiting.values()) w.reject(err);
    this.waiting.clear();
    this.sub.unsubscribe();
  }
}

const CR_OR_LF = /[\r\n]/;

/**
 * Sets one of JetStream's headers, whose names are skiff's own: straight into
 * the map of nats.js's headers when it has no such header yet (its set()
 * looks the key up twice, building arrays each time: about 2 KB of heap an
 * async run), else by set(). A value with CR or LF is refused, as set() does.
 */
function setHeader(h: MsgHdrs, key: string, value: string): void {
  if (CR_OR_LF.test(value)) throw new PublishError(`the ${key} header's value holds CR or LF`);
  if (h instanceof MsgHdrsImpl && !h.headers.has(key)) h.headers.set(key, [value]);
  else h.set(key, value);
}

/** JetStream's acknowledgement in `msg`, or its refusal. */
function settleAck(msg: Msg, subject: string, resolve: (ack: PubAck) => void, reject: (err: Error) => void): void {
  try {
    const ack = JSON.parse(decoder.decode(msg.data)) as Partial<PubAck> & {
      error?: { code?: number; err_code?: number; description?: string };
    };
    if (ack.error)
      reject(
        new PublishError(ack.error.description ?? `JetStream refused a message on ${subject}`, ack.error.err_code),
      );
    else resolve({ stream: ack.stream ?? "", seq: ack.seq ?? 0, duplicate: ack.duplicate === true });
  } catch {
    reject(new PublishError(`JetStream's answer to a message on ${subject} is not an acknowledgement`));
  }
}

const publishers = new WeakMap<NatsConnection, AckedPublisher>();

/**
 * Publishes to a JetStream stream and resolves with its acknowledgement.
 * Publishes on one connection are pipelined: none waits for another.
 */
export function publishAcked(
  nc: NatsConnection,
  subject: string,
  data: Uint8Array,
  opts?: PublishOptions,
): Promise<PubAck> {
  return publisherOf(nc).publish(subject, data, opts);
}

/**
 * A request on the connection's shared reply subscription (see
 * AckedPublisher.request): many in flight at once, none costing a
 * subscription entry, a timer or an error object of its own.
 */
export function requestPipelined(nc: NatsConnection, subject: string, data: Uint8Array): Promise<Msg> {
  return publisherOf(nc).request(subject, data);
}

const ACK = encoder.encode("+ACK");

/**
 * Acks a JetStream message and resolves once the server has confirmed it (as
 * JsMsg.ackAck(), on the connection's shared reply subscription): the
 * message will not be delivered again. Rejects when no confirmation comes
 * (the consumer gone, a timeout). `msg` is acked here only: nothing else may
 * ack, nak or mark it working afterwards.
 */
export async function confirmAck(nc: NatsConnection, msg: JsMsg): Promise<void> {
  // nats.js's JsMsg has the subject to ack on as `reply`, outside its typed interface: else its own ackAck().
  const reply = (msg as { reply?: unknown }).reply;
  if (typeof reply === "string" && reply !== "") await requestPipelined(nc, reply, ACK);
  else if (!(await msg.ackAck())) throw new PublishError(`the message on ${msg.subject} could not be acked`);
}

/** A JetStream API answer's error. */
interface ApiError {
  code?: number;
  err_code?: number;
  description?: string;
}

/**
 * A JetStream API request (`$JS.API.…`) on the shared reply subscription, its
 * JSON answer parsed; `what` names it in errors ("cannot {what}: …"). The
 * answer's own `error` is the caller's to judge (some mean "not there").
 */
export async function apiRequest<T extends object>(
  nc: NatsConnection,
  subject: string,
  body: object,
  what: string,
): Promise<T & { error?: ApiError }> {
  const msg = await requestPipelined(nc, subject, encoder.encode(JSON.stringify(body)));
  try {
    return JSON.parse(decoder.decode(msg.data)) as T & { error?: ApiError };
  } catch {
    throw new PublishError(`cannot ${what}: JetStream's answer is not JSON`);
  }
}

/** The PublishError of a JetStream API answer that failed: its description (else `otherwise`) and code. */
export function apiFailure(what: string, error: ApiError | undefined, otherwise: string): PublishError {
  return new PublishError(`cannot ${what}: ${error?.description ?? otherwise}`, error?.err_code);
}

function publisherOf(nc: NatsConnection): AckedPublisher {
  let publisher = publishers.get(nc);
  if (publisher === undefined) {
    publisher = new AckedPublisher(nc, PUBLISH_TIMEOUT_MS);
    publishers.set(nc, publisher);
  }
  return publisher;
}
