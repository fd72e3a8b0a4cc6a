// Loading data for a page: the first load, a reload on demand, and (with
// `refreshMs`) a refresh after each completed load while the page is open.
// A failed refresh keeps the last data and reports the error beside it.
import { useCallback, useEffect, useRef, useState } from "react";

export interface Loaded<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
  reload: () => void;
}

interface State<T> {
  /** The inputs the data was loaded for. */
  key: string;
  data: T | undefined;
  error: unknown;
  loading: boolean;
}

/** `deps` are plain values (ids, filters); the load runs again when one changes. */
export function useLoad<T>(
  load: (signal: AbortSignal) => Promise<T>,
  deps: readonly (string | number | boolean | undefined)[],
  opts: { refreshMs?: number } = {},
): Loaded<T> {
  const key = JSON.stringify(deps);
  const [state, setState] = useState<State<T>>({ key, data: undefined, error: undefined, loading: true });
  const [generation, setGeneration] = useState(0);
  const loadRef = useRef(load);
  loadRef.current = load;

  useEffect(() => {
    const ctl = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const once = async () => {
      try {
        const data = await loadRef.current(ctl.signal);
        if (!ctl.signal.aborted) setState({ key, data, error: undefined, loading: false });
      } catch (error) {
        if (!ctl.signal.aborted)
          setState((s) => ({ key, data: s.key === key ? s.data : undefined, error, loading: false }));
      }
      if (!ctl.signal.aborted && opts.refreshMs) timer = setTimeout(once, opts.refreshMs);
    };
    void once();
    return () => {
      ctl.abort();
      clearTimeout(timer);
    };
  }, [key, generation, opts.refreshMs]);

  const reload = useCallback(() => setGeneration((g) => g + 1), []);
  // Data loaded for other inputs (the previous project) is never shown for these.
  if (state.key !== key) return { data: undefined, error: undefined, loading: true, reload };
  return { data: state.data, error: state.error, loading: state.loading, reload };
}
