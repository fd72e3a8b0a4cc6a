// The run history's input. Every run event carries its run's record (header
// `Skiff-Run`); the records of the events one connection writes together
// also go, one per line, into a single message on `skiff.history.runs`
// (SKIFF_EVENTS), added to that write just before it goes (coalesce.ts
// beforeWrite). The run history follows those messages only: the server
// stores each event once and sends the history one message for every write
// of runs rather than one per run, and the history parses one message for
// many (bench/README.md). The events stay as they are for their consumers.
//
// Order: a record goes after its event, on the same connection, so the
// stream holds a run's records in the order of its events. An event published
// acknowledged (publishRunEvent) has its record fed once the event is stored,
// naming the event's sequence (`event_seq`: an async run's result is read
// from its terminal event once its KV record is gone), and resolves once the
// message with the record is stored too: what is acknowledged is in the
// history's input. The others are as durable as their events (which nothing
// awaits).
import { deferred, type Deferred, type NatsConnection } from "nats";
import { WAITED_FLUSH_MS, beforeWrite, inBackground, publishAcked, subjects } from "../nats/index.js";

/** Most bytes one message carries; it also stays within the server's max_payload. */
const MAX_FEED_BYTES = 256 * 1024;
/** Room for the message's protocol line within max_payload. */
const HEADROOM_BYTES = 1024;

const encoder = new TextEncoder();

export class RecordFeed {
  private lines: string[] = [];
  private bytes = 0;
  /** The acknowledgement that acked records of the pending message wait for; none while none does. */
  private acked: Deferred<void> | undefined;
  private scheduled = false;
  /** Whether an acked record of the pending message is of a run alone (its message goes at once). */
  private hurried = false;
  private readonly limit: number;
  /** Whether the connection's writes take the pending message along (else each record goes at once). */
  private readonly batched: boolean;

  constructor(private readonly nc: NatsConnection) {
    // Counted in UTF-16 units, of which each is at most three bytes.
    this.limit = Math.floor(Math.min(MAX_FEED_BYTES, (nc.info?.max_payload ?? MAX_FEED_BYTES) - HEADROOM_BYTES) / 3);
    this.batched = beforeWrite(nc, () => this.flush());
  }

  /**
   * Adds a record (its JSON, as the event's header has it) to the next message, which goes with the
   * connection's next write: the one that its event, published in the background just before, is due in.
   */
  add(text: string): void {
    this.push(text);
    if (!this.batched) this.flush();
  }

  /**
   * Adds a record; resolves once the message that carries it is stored. It goes at the end of the turn, or,
   * when `together` (other runs are under way: their writes come soon), with the connection's next write,
   * WAITED_FLUSH_MS at most.
   */
  addAcked(text: string, together = false): Promise<void> {
    // Pushed first: a message that it would take past its size goes before, with its own acknowledgement.
    this.push(text);
    const ack = (this.acked ??= deferred<void>());
    if (!together) this.hurried = true;
    if (!this.batched) this.flush();
    // The records of a turn's acknowledgements together, in a message that goes at once.
    else if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.atTurnEnd);
    }
    return ack;
  }

  /** Publishes what is pending as one message. */
  flush(): void {
    if (this.lines.length === 0) return;
    const data = encoder.encode(this.lines.length === 1 ? this.lines[0] : this.lines.join("\n"));
    const ack = this.acked;
    this.lines = [];
    this.bytes = 0;
    this.acked = undefined;
    this.hurried = false;
    // It goes from a write of the connection or the end of a turn: a connection that cannot take it (closed,
    // draining) fails what waits for it, and throws nowhere. Its events, published just before, failed alike
    // where they were published.
    try {
      if (ack === undefined) this.nc.publish(subjects.historyRuns, data);
      else
        publishAcked(this.nc, subjects.historyRuns, data).then(
          () => ack.resolve(),
          (err: unknown) => ack.reject(err),
        );
    } catch (err) {
      ack?.reject(err);
    }
  }

  private push(text: string): void {
    // A record that would take the message past its size goes in the next one (JSON's text has no newline).
    if (this.bytes > 0 && this.bytes + text.length + 1 > this.limit) this.flush();
    this.lines.push(text);
    this.bytes += text.length + 1;
  }

  private readonly atTurnEnd = () => {
    this.scheduled = false;
    if (this.hurried) this.flush();
    else inBackground(this.nc, () => this.flush(), WAITED_FLUSH_MS);
  };
}

const feeds = new WeakMap<NatsConnection, RecordFeed>();

/** The connection's feed. */
export function recordFeed(nc: NatsConnection): RecordFeed {
  let feed = feeds.get(nc);
  if (feed === undefined) feeds.set(nc, (feed = new RecordFeed(nc)));
  return feed;
}
