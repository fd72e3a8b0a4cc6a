// The runs of one app, or of every app of a project, newest first, kept up to
// date: a page from ListRuns, then every change from the WatchRuns stream.
// When the stream cannot be opened or breaks, the first page is polled
// instead, and the page says so.
import { useCallback, useEffect, useRef, useState } from "react";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { Run } from "../../gen/skiff/management/v2/management_pb.js";
import { describeError, type Management } from "./api.js";

export const PAGE_SIZE = 50;
export const POLL_MS = 3000;
/** The app name that means every app of the project (AIP-159), in ListRuns and in the page's URL. */
export const ALL_APPS = "-";

export interface RunFilter {
  asyncOnly: boolean;
  /** "" for every status. */
  status: string;
}

export type Liveness = { mode: "connecting" } | { mode: "stream" } | { mode: "polling"; reason: string };

export interface LiveRuns {
  runs: Run[];
  loading: boolean;
  error: unknown;
  liveness: Liveness;
  /** Undefined when there are no older runs. */
  loadOlder: (() => void) | undefined;
  loadingOlder: boolean;
}

const matches = (r: Run, f: RunFilter) => (!f.asyncOnly || r.async) && (f.status === "" || r.status === f.status);

/** Newest first: by queue time, then by id (time-sortable) among equals. */
function newestFirst(a: Run, b: Run): number {
  const ta = a.queuedAt ? timestampMs(a.queuedAt) : 0;
  const tb = b.queuedAt ? timestampMs(b.queuedAt) : 0;
  return tb - ta || (a.runId < b.runId ? 1 : a.runId > b.runId ? -1 : 0);
}

export function useLiveRuns(client: Management, projectId: string, appName: string, filter: RunFilter): LiveRuns {
  const { asyncOnly, status } = filter;
  const byId = useRef(new Map<string, Run>());
  const [runs, setRuns] = useState<Run[]>([]);
  const [loading, setLoading] = useState(true);
  const [error, setError] = useState<unknown>();
  const [liveness, setLiveness] = useState<Liveness>({ mode: "connecting" });
  const [next, setNext] = useState("");
  const [loadingOlder, setLoadingOlder] = useState(false);

  const publish = useCallback(() => setRuns([...byId.current.values()].sort(newestFirst)), []);

  useEffect(() => {
    const f = { asyncOnly, status };
    const ctl = new AbortController();
    const { signal } = ctl;
    byId.current = new Map();
    setRuns([]);
    setLoading(true);
    setError(undefined);
    setNext("");
    setLiveness({ mode: "connecting" });

    /** A change from the stream or a poll is the newest word on a run. */
    const apply = (r: Run) => {
      if (matches(r, f)) byId.current.set(r.runId, r);
      else byId.current.delete(r.runId);
    };
    const all = appName === ALL_APPS;
    const firstPage = () => client.listRuns({ projectId, appName, pageSize: PAGE_SIZE, asyncOnly, status }, { signal });

    let pollTimer: ReturnType<typeof setTimeout> | undefined;
    const poll = async () => {
      try {
        const page = await firstPage();
        page.runs.forEach(apply);
        publish();
        setError(undefined);
      } catch (err) {
        if (!signal.aborted) setError(err);
      }
      if (!signal.aborted) pollTimer = setTimeout(poll, POLL_MS);
    };

    void (async () => {
      try {
        // WatchRuns names every app with an empty app name.
        for await (const change of client.watchRuns({ projectId, appName: all ? "" : appName }, { signal })) {
          setLiveness({ mode: "stream" });
          if (change.run && (all || change.run.appName === appName)) {
            apply(change.run);
            publish();
          }
        }
        throw new Error("the live stream ended");
      } catch (err) {
        if (signal.aborted) return;
        setLiveness({ mode: "polling", reason: describeError(err) });
        pollTimer = setTimeout(poll, POLL_MS);
      }
    })();
    // The stream answers only once something changes; until then it counts as open.
    const opened = setTimeout(() => setLiveness((l) => (l.mode === "connecting" ? { mode: "stream" } : l)), 1000);

    void (async () => {
      try {
        const page = await firstPage();
        // Whatever the stream delivered meanwhile is newer than the page.
        for (const r of page.runs) if (!byId.current.has(r.runId) && matches(r, f)) byId.current.set(r.runId, r);
        setNext(page.nextPageToken);
        publish();
      } catch (err) {
        if (!signal.aborted) setError(err);
      } finally {
        if (!signal.aborted) setLoading(false);
      }
    })();

    return () => {
      ctl.abort();
      clearTimeout(pollTimer);
      clearTimeout(opened);
    };
  }, [client, projectId, appName, asyncOnly, status, publish]);

  const loadOlder = useCallback(async () => {
    setLoadingOlder(true);
    try {
      const page = await client.listRuns({
        projectId,
        appName,
        pageSize: PAGE_SIZE,
        asyncOnly,
        status,
        pageToken: next,
      });
      for (const r of page.runs) if (!byId.current.has(r.runId)) byId.current.set(r.runId, r);
      setNext(page.nextPageToken);
      publish();
    } catch (err) {
      setError(err);
    } finally {
      setLoadingOlder(false);
    }
  }, [client, projectId, appName, asyncOnly, status, next, publish]);

  return { runs, loading, error, liveness, loadOlder: next ? () => void loadOlder() : undefined, loadingOlder };
}
