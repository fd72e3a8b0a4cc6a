// Bodies too large for a NATS message (a run's request or answer) travel
// through object store `skiff-results` under `transfer.{id}`: the frame that
// would carry one names it instead, and its receiver reads and removes it.
import type { NatsConnection, ObjectStore } from "nats";

/** Room for a frame's metadata and NATS headers within max_payload. */
const FRAME_HEADROOM_BYTES = 64 * 1024;

/** Moves large bodies through the object store. */
export class BodyTransfer {
  /** The largest body a frame carries itself. */
  readonly limit: number;
  constructor(
    nc: NatsConnection,
    private readonly objects: () => Promise<ObjectStore>,
  ) {
    this.limit = nc.info!.max_payload - FRAME_HEADROOM_BYTES;
  }

  /** The sending side: the body to put in the frame, or none and the object it went to when too large for one. */
  async send(id: string, body: Uint8Array): Promise<{ body: Uint8Array; object?: string }> {
    if (body.byteLength <= this.limit) return { body };
    const name = `transfer.${id}`;
    await (await this.objects()).putBlob({ name }, body);
    return { body: new Uint8Array(0), object: name };
  }

  /** The receiving side: the body a frame carried, read back from the store when it was there, and removed unless `keep`. */
  async receive(body: Uint8Array, object: string | undefined, keep = false): Promise<Uint8Array> {
    if (object === undefined) return body;
    const os = await this.objects();
    const data = await os.getBlob(object);
    if (data === null) throw new Error(`run body ${object} is missing from the object store`);
    if (!keep) await os.delete(object).catch(() => undefined);
    return data;
  }

  /** Removes a stored body nobody will read (the request failed). */
  async drop(object: string | undefined): Promise<void> {
    if (object !== undefined) await (await this.objects()).delete(object).catch(() => undefined);
  }
}
