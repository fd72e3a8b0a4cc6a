// A small history-API router: the URL is the state of the page (project, app,
// filters, run), so every view can be bookmarked, reloaded and shared. skiff
// answers index.html for these paths, and the app reads them here.
import { useEffect, useState, type AnchorHTMLAttributes, type MouseEvent } from "react";

const CHANGE = "skiff:navigate";

export interface Location {
  path: string;
  query: URLSearchParams;
  /** Path and query as the address bar has them. */
  href: string;
}

function current(): Location {
  return {
    path: location.pathname,
    query: new URLSearchParams(location.search),
    href: location.pathname + location.search,
  };
}

export function navigate(to: string, opts: { replace?: boolean } = {}): void {
  if (to === location.pathname + location.search) return;
  if (opts.replace) history.replaceState(null, "", to);
  else history.pushState(null, "", to);
  window.dispatchEvent(new Event(CHANGE));
}

/**
 * Replaces the address from an effect, only while the page is still at `from`, the location its render saw:
 * React can run an effect after an event that navigated since (a click on a link right after sign-in), and
 * the effect must not take the page back.
 */
export function redirect(from: Location, to: string): void {
  if (location.pathname + location.search === from.href) navigate(to, { replace: true });
}

export function useLocation(): Location {
  const [loc, setLoc] = useState(current);
  useEffect(() => {
    const update = () => setLoc(current());
    window.addEventListener("popstate", update);
    window.addEventListener(CHANGE, update);
    return () => {
      window.removeEventListener("popstate", update);
      window.removeEventListener(CHANGE, update);
    };
  }, []);
  return loc;
}

/** `/projects/:project/runs` against a path: the named segments, decoded, or undefined. */
export function match(pattern: string, path: string): Record<string, string> | undefined {
  const want = pattern.split("/");
  const got = path.replace(/\/+$/, "").split("/");
  if (want.length !== got.length) return undefined;
  const params: Record<string, string> = {};
  for (let i = 0; i < want.length; i++) {
    if (want[i].startsWith(":")) {
      try {
        params[want[i].slice(1)] = decodeURIComponent(got[i]);
      } catch {
        return undefined;
      }
    } else if (want[i] !== got[i]) return undefined;
  }
  return params;
}

/** A path from segments, each encoded. */
export function href(...segments: string[]): string {
  return "/" + segments.map(encodeURIComponent).join("/");
}

/** A real link (middle-click, copy address and keyboard all work) that navigates without a reload. */
export function Link(props: AnchorHTMLAttributes<HTMLAnchorElement> & { href: string }) {
  const onClick = (e: MouseEvent<HTMLAnchorElement>) => {
    props.onClick?.(e);
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(props.href);
  };
  return <a {...props} onClick={onClick} />;
}
