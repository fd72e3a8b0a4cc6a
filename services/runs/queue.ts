// Async runs waiting or running, as the work-queue stream SKIFF_RUNS counts
// them: a message stays on `skiff.runs.queue.{project}.{app}` until its run
// is final, so the count of an app's subject is its queue depth.
import type { JetStreamManager } from "nats";
import { streams, subjects } from "../nats/index.js";

interface QueuedRuns {
  project: string;
  app: string;
  count: number;
}

const PREFIX = subjects.runQueue("", "").slice(0, -1);

/** The queue depth of one app, or of every app with runs queued; one JetStream request. */
export async function queuedRuns(jsm: JetStreamManager, app?: { project: string; app: string }): Promise<QueuedRuns[]> {
  const filter = app ? subjects.runQueue(app.project, app.app) : subjects.runQueueAll;
  const info = await jsm.streams.info(streams.runs.name, { subjects_filter: filter });
  const counts = Object.entries(info.state.subjects ?? {}).map(([subject, count]) => {
    const [project = "", name = ""] = subject.slice(PREFIX.length).split(".");
    return { project, app: name, count };
  });
  return app && counts.length === 0 ? [{ ...app, count: 0 }] : counts;
}
