// The run commands: `run <app>/<function>` (sync, or --async for a run id),
// `runs <app>` (the newest runs) and `run-status <run-id> [--app <app>]`.
import { readFile } from "node:fs/promises";
import { toJson, toJsonString } from "@bufbuild/protobuf";
import { timestampDate, ValueSchema, type Timestamp } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { ListRunsResponseSchema, RunSchema, type Run } from "../../gen/skiff/management/v2/management_pb.js";
import { RUN_STATUSES } from "../runs/status.js";
import { projectOf, UsageError, type Command, type CommandContext } from "./commands.js";
import { table } from "./table.js";

const time = (t: Timestamp | undefined) => (t ? timestampDate(t).toISOString() : "");

/** --data as given, or the contents of @file. */
async function data(raw: string | undefined): Promise<Uint8Array> {
  if (raw === undefined) return new TextEncoder().encode("{}");
  if (!raw.startsWith("@")) return new TextEncoder().encode(raw);
  try {
    return await readFile(raw.slice(1));
  } catch (err) {
    throw new Error(`--data ${raw}: cannot read the file (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
}

const invocation = (ctx: CommandContext) => createClient(InvocationService, ctx.transport);

/**
 * The X-Webhook-Secret header of --webhook-secret-file: the file's text less one final line break (the
 * client's transport writes a header's text as UTF-8, the bytes the server takes the secret from). Read from
 * a file, never the command line, where `ps` and the shell's history would show it.
 */
async function webhookSecretHeader(
  file: string | undefined,
  webhook: string | undefined,
): Promise<Record<string, string>> {
  if (file === undefined) return {};
  if (webhook === undefined) throw new UsageError("--webhook-secret-file signs a webhook: give --webhook <url> too");
  let text: string;
  try {
    text = (await readFile(file, "utf8")).replace(/\r?\n$/, "");
  } catch (err) {
    throw new Error(
      `--webhook-secret-file ${file}: cannot read the file (${(err as NodeJS.ErrnoException).code ?? String(err)})`,
    );
  }
  if (text === "") throw new Error(`--webhook-secret-file ${file}: the file is empty`);
  return { "x-webhook-secret": text };
}

export const run: Command = {
  options: ["project", "data", "async", "webhook", "webhook-secret-file"],
  positionals: 1,
  async run(ctx) {
    const target = ctx.positionals[0];
    const cut = target?.indexOf("/") ?? -1;
    if (!target || cut <= 0 || cut === target.length - 1)
      throw new UsageError('name the app and function: skiff run <app>/<function>, e.g. "hello-python/run"');
    const webhook = ctx.options.webhook as string | undefined;
    const headers = await webhookSecretHeader(ctx.options["webhook-secret-file"] as string | undefined, webhook);
    const res = await invocation(ctx).run(
      {
        projectId: projectOf(ctx),
        appName: target.slice(0, cut),
        path: target.slice(cut + 1),
        async: ctx.options.async === true,
        webhookEndpoint: webhook ?? "",
        body: { contentType: "application/json", data: await data(ctx.options.data as string | undefined) },
      },
      { headers },
    );
    if (ctx.options.async === true) return ctx.out(ctx.json ? JSON.stringify({ run_id: res.runId }) : res.runId);
    ctx.out(new TextDecoder().decode(res.body?.data ?? new Uint8Array()));
    // The answer is printed either way; exit 1 says it was an error.
    if (res.statusCode >= 400) throw new Error(`the app answered ${res.statusCode} (run ${res.runId})`);
  },
};

export const runs: Command = {
  options: ["project", "async", "status", "limit"],
  positionals: 1,
  async run(ctx) {
    const appName = ctx.positionals[0];
    if (!appName) throw new UsageError("name the app: skiff runs <app>");
    const status = (ctx.options.status as string | undefined) ?? "";
    if (status !== "" && !(RUN_STATUSES as readonly string[]).includes(status))
      throw new UsageError(`--status must be one of ${RUN_STATUSES.join(", ")}`);
    const pageSize = ctx.options.limit === undefined ? 50 : Number(ctx.options.limit);
    if (!Number.isInteger(pageSize) || pageSize < 1 || pageSize > 500)
      throw new UsageError("--limit must be a whole number from 1 to 500");
    const res = await ctx.client.listRuns({
      projectId: projectOf(ctx),
      appName,
      asyncOnly: ctx.options.async === true,
      status,
      pageSize,
    });
    if (ctx.json)
      return ctx.out(JSON.stringify(toJson(ListRunsResponseSchema, res, { useProtoFieldName: true }), null, 2));
    ctx.out(
      table(
        ["run", "status", "mode", "path", "queued", "ms", "http"],
        res.runs.map((r) => [
          r.runId,
          r.status,
          r.async ? "async" : "sync",
          r.path,
          time(r.queuedAt),
          r.runTimeMs ? String(r.runTimeMs) : "",
          r.statusCode ? String(r.statusCode) : "",
        ]),
      ),
    );
  },
};

function details(r: Run): string {
  const lines = [
    `run:      ${r.runId} (${r.async ? "async" : "sync"}) ${r.projectId}/${r.appName} ${r.path}`,
    `status:   ${r.status}${r.error ? ` (${r.error.type}: ${r.error.message})` : ""}`,
    `attempts: ${r.attempts}`,
    `queued:   ${time(r.queuedAt)}; started ${time(r.startedAt) || "-"}; finished ${time(r.finishedAt) || "-"}`,
    `took:     ${r.runTimeMs} ms, HTTP ${r.statusCode || "-"}`,
  ];
  if (r.webhookEndpoint)
    lines.push(
      `webhook:  ${r.webhookEndpoint} (${r.webhookDeliveries.map((d) => d.state).join(", ") || "no delivery yet"})`,
    );
  if (r.result) lines.push(`result:   ${toJsonString(ValueSchema, r.result)}`);
  else if (r.rawResult) lines.push(`result:   ${r.rawResult.data.byteLength} bytes of ${r.rawResult.contentType}`);
  return lines.join("\n");
}

export const runStatus: Command = {
  options: ["project", "app"],
  positionals: 1,
  async run(ctx) {
    const runId = ctx.positionals[0];
    // Without --app, the run is looked up in every app of the project ("-", as ListRuns takes it).
    const appName = (ctx.options.app as string | undefined) ?? "-";
    if (!runId) throw new UsageError("skiff run-status <run-id> [--app <app>]");
    const res = await ctx.client.getRun({ projectId: projectOf(ctx), appName, runId });
    ctx.out(
      ctx.json ? JSON.stringify(toJson(RunSchema, res.run!, { useProtoFieldName: true }), null, 2) : details(res.run!),
    );
  },
};
