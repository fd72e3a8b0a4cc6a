// Which apps this process's runner serves right now, as a stream of
// "added" and "removed" calls: a runner answers an app's sync requests and
// works its queue only while it has a version of it deployed. The runner
// deploys in the background after a registry change, so the set is re-read
// on every registry change and, synchronously, on every change of the
// runner's apps: an app is added in the same turn as version() first
// answers for it. (It was re-read every 250 ms instead: for up to that long
// a runner with the app, its replicas published as ready, was in no queue
// group, and a gateway that found no other runner answered 503 "no runner
// hosts app".)
import type { Runner } from "./runner.js";
import type { AppRegistry } from "../apps/index.js";

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
  const stopRunner = runner.onAppsChange(check);
  const stopRegistry = registry.onChange(() => setImmediate(check));
  check();
  return () => {
    stopRunner();
    stopRegistry();
    for (const ref of serving.values()) on.removed(ref);
    serving.clear();
  };
}
