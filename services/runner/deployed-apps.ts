// Which apps this process's runner serves right now, as a stream of
// "added" and "removed" calls: a runner answers an app's sync requests and
// works its queue only while it has a version of it deployed. The runner
// deploys in the background after a registry change, so the set is
// re-read on every change and on a short period.
import type { Runner } from "./runner.js";
import type { AppRegistry } from "../apps/index.js";

const CHECK_EVERY_MS = 250;

export interface AppRef {
  projectId: string;
  appName: string;
}

export function followDeployedApps(
  runner: Runner,
  registry: AppRegistry,
  on: { added(app: AppRef): void; removed(app: AppRef): void },
): () => void {
  const serving = new Map<string, AppRef>();
  const check = () => {
    const now = new Set<string>();
    for (const app of registry.list()) {
      if (runner.version(app.project_id, app.app_name) === undefined) continue;
      const key = `${app.project_id}.${app.app_name}`;
      now.add(key);
      if (!serving.has(key)) {
        const ref = { projectId: app.project_id, appName: app.app_name };
        serving.set(key, ref);
        on.added(ref);
      }
    }
    for (const [key, ref] of serving) {
      if (now.has(key)) continue;
      serving.delete(key);
      on.removed(ref);
    }
  };
  const timer = setInterval(check, CHECK_EVERY_MS);
  timer.unref();
  const stop = registry.onChange(() => setImmediate(check));
  check();
  return () => {
    clearInterval(timer);
    stop();
    for (const ref of serving.values()) on.removed(ref);
    serving.clear();
  };
}
