// The app commands: `deploy <dir>`, `apps list|get|delete`, `logs <app>`.
import { toJson } from "@bufbuild/protobuf";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import {
  AppSchema,
  ListAppsResponseSchema,
  ListAppLogsResponseSchema,
  type App,
  type LogLine,
} from "../../gen/skiff/management/v2/management_pb.js";
import { BundleError, packApp } from "../apps/bundle.js";
import { projectOf, UsageError, type Command, type CommandContext } from "./commands.js";
import { table } from "./table.js";
import { progressBar, uploadBundle } from "./upload.js";

const time = (t: Timestamp | undefined) => (t ? timestampDate(t).toISOString() : "");

function runtimeText(a: App): string {
  const r = a.runtime;
  if (!r) return "";
  return r.kind === "cortex" ? `cortex ${r.language} ${r.entry}` : `custom ${r.command.join(" ")}`;
}

/** The replica limits the app's config asks for, if any. */
function limitsText(a: App): string {
  const r = a.runtime;
  const parts = [
    r?.cpu ? `cpu ${r.cpu}` : "",
    r?.memoryMb ? `memory ${r.memoryMb} MiB (at most the machine's SKIFF_REPLICA_MEMORY_MB)` : "",
  ].filter((p) => p !== "");
  return parts.length > 0 ? `; replica limits: ${parts.join(", ")}` : "";
}

function appDetails(a: App): string {
  const s = a.scaling;
  const d = a.deployment;
  const lines = [
    `app:        ${a.appName} (project ${a.projectId})`,
    `runtime:    ${runtimeText(a)}`,
    `config:     ${a.configFile || "skiff.toml"}${limitsText(a)}`,
    `deployment: version ${d?.version ?? 0}, ${d?.bundleBytes ?? 0} bytes, sha256 ${d?.digest ?? ""}, by ${d?.createdBy ?? ""} at ${time(d?.createdAt)}`,
    `scaling:    min_replicas ${s?.minReplicas}, max_replicas ${s?.maxReplicas}, replica_concurrency ${s?.replicaConcurrency}, cooldown ${s?.cooldown} s, response_grace_period ${s?.responseGracePeriod} s`,
    `env:        ${a.envNames.length === 0 ? "(none)" : a.envNames.join(", ")}`,
    `created:    ${time(a.createdAt)}; updated ${time(a.updatedAt)}`,
    "",
    a.replicas.length === 0
      ? "replicas:   none running (they start on the first call)"
      : table(
          ["replica", "state", "version", "in flight", "host", "started"],
          a.replicas.map((r) => [
            r.replicaId,
            r.state,
            String(r.deploymentVersion),
            String(r.inFlight),
            r.host,
            time(r.startedAt),
          ]),
        ),
  ];
  return lines.join("\n");
}

function logText(l: LogLine): string {
  return `${time(l.time)} ${l.replicaId}${l.runId ? ` [${l.runId}]` : ""} ${l.stream === "stderr" ? "! " : ""}${l.text}`;
}

const appName = (ctx: CommandContext, usage: string): string => {
  const name = ctx.positionals[0];
  if (name === undefined) throw new UsageError(`${usage} needs an app name`);
  return name;
};

export const deploy: Command = {
  options: ["project"],
  positionals: 1,
  async run(ctx) {
    const dir = ctx.positionals[0];
    if (dir === undefined) throw new UsageError("deploy needs the app folder: skiff deploy <dir>");
    let packed;
    try {
      packed = await packApp(dir);
    } catch (err) {
      if (err instanceof BundleError || (err as NodeJS.ErrnoException).code === "ENOENT")
        // The folder's problem, not the command line's: exit code 1, as any refusal.
        throw new Error(`cannot pack ${dir}: ${(err as Error).message}`);
      throw err;
    }
    const projectId = projectOf(ctx);
    ctx.err(`packed ${packed.files.length} files from ${dir}`);
    const res = (await uploadBundle({
      url: ctx.target.url,
      token: ctx.target.token,
      projectId,
      bytes: packed.bytes,
      onProgress: progressBar((t) => process.stderr.write(t), process.stderr.isTTY === true, "uploading"),
    })) as { app?: { app_name?: string; deployment?: { version?: number } }; warnings?: string[] };
    if (ctx.json) return ctx.out(JSON.stringify(res, null, 2));
    // What the configuration file asks that skiff ignores, as the server read it.
    for (const w of res.warnings ?? []) ctx.err(`warning: ${w}`);
    ctx.out(`deployed ${res.app?.app_name} version ${res.app?.deployment?.version} to project ${projectId}`);
  },
};

export const apps: Record<string, Command> = {
  list: {
    options: ["project"],
    positionals: 0,
    async run(ctx) {
      const res = await ctx.client.listApps({ projectId: projectOf(ctx) });
      if (ctx.json)
        return ctx.out(JSON.stringify(toJson(ListAppsResponseSchema, res, { useProtoFieldName: true }), null, 2));
      ctx.out(
        table(
          ["name", "runtime", "version", "replicas", "updated"],
          res.apps.map((a) => [
            a.appName,
            runtimeText(a),
            String(a.deployment?.version ?? 0),
            String(a.replicas.length),
            time(a.updatedAt),
          ]),
        ),
      );
    },
  },
  get: {
    options: ["project"],
    positionals: 1,
    async run(ctx) {
      const res = await ctx.client.getApp({ projectId: projectOf(ctx), appName: appName(ctx, "apps get") });
      ctx.out(
        ctx.json
          ? JSON.stringify(toJson(AppSchema, res.app!, { useProtoFieldName: true }), null, 2)
          : appDetails(res.app!),
      );
    },
  },
  delete: {
    options: ["project"],
    positionals: 1,
    async run(ctx) {
      const name = appName(ctx, "apps delete");
      await ctx.client.deleteApp({ projectId: projectOf(ctx), appName: name });
      ctx.out(ctx.json ? "{}" : `deleted app ${name} of project ${projectOf(ctx)}; its replicas are stopping`);
    },
  },
};

export const logs: Command = {
  options: ["project", "run", "follow", "limit"],
  positionals: 1,
  async run(ctx) {
    const name = appName(ctx, "logs");
    const limitText = ctx.options.limit as string | undefined;
    if (limitText !== undefined && !/^\d+$/.test(limitText))
      throw new UsageError(`--limit: expected a whole number, got "${limitText}"`);
    const limit = limitText === undefined ? 0 : Number(limitText);
    const runId = (ctx.options.run as string | undefined) ?? "";
    if (ctx.options.follow) {
      if (runId !== "") throw new UsageError("--follow shows every line; it does not take --run");
      for await (const res of ctx.client.tailAppLogs({
        projectId: projectOf(ctx),
        appName: name,
        backlog: limit || 50,
      })) {
        if (res.line)
          ctx.out(
            ctx.json
              ? JSON.stringify({
                  time: time(res.line.time),
                  replica_id: res.line.replicaId,
                  stream: res.line.stream,
                  run_id: res.line.runId,
                  text: res.line.text,
                })
              : logText(res.line),
          );
      }
      return;
    }
    const res = await ctx.client.listAppLogs({ projectId: projectOf(ctx), appName: name, runId, limit });
    if (ctx.json)
      return ctx.out(
        JSON.stringify(
          { lines: [], ...(toJson(ListAppLogsResponseSchema, res, { useProtoFieldName: true }) as object) },
          null,
          2,
        ),
      );
    if (res.lines.length === 0)
      return ctx.err(
        `no log lines${runId === "" ? "" : ` of run ${runId}`} for app ${name} of project ${projectOf(ctx)}`,
      );
    ctx.out(res.lines.map(logText).join("\n"));
  },
};
