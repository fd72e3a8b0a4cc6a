// `skiff`: manage a skiff server from the command line. Exit codes: 0 done,
// 1 the server refused or could not be reached, 2 the command line is wrong.
import { parseArgs } from "node:util";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../auth/bearer.js";
import { apps, deploy, logs } from "./app-commands.js";
import { COMMANDS, DEFAULT_EXPIRES_IN, DEFAULT_PROJECT, UsageError, type Command } from "./commands.js";
import { DEFAULT_URL, resolveTarget, type Target } from "./defaults.js";
import { run, runs, runStatus } from "./run-commands.js";
import { secrets } from "./secret-commands.js";

const USAGE = `Usage: skiff <command> [options]

Commands:
  deploy <dir>                           pack the app folder (honouring .gitignore and
                                         .skiffignore), upload it, print the new version
  apps list                              list the apps of a project
  apps get <app>                         config, scaling, deployment and live replicas
  apps delete <app>                      stop its replicas and remove the app
  logs <app>                             the newest lines its replicas wrote
      --run <run-id>                     only the lines of one run
      --limit <n>                        at most n lines (default 200; with --follow, 50 first)
      -f, --follow                       keep printing new lines until interrupted
  run <app>/<function>                   run it and print its answer (a Custom app: <app>/<path>)
      -d, --data <json>|@<file>          the request body (default {})
      --async                            queue it and print the run id
      --webhook <url>                    also POST the answer to this URL
      --webhook-secret-file <file>       sign it with the secret in this file (X-Webhook-Signature)
  runs <app>                             the newest runs of an app
      --async                            only async runs
      --status <status>                  only runs in this state (queued, running,
                                         success, failure, cancelled)
      --limit <n>                        at most n runs (default 50, max 500)
  run-status <run-id> [--app <app>]      a run's state, timings, error and result
  projects list                          list projects (a service account sees its own)
  projects create [<project-id>]         create a project (admin); id "p-…" made when omitted
      --name <name>
  projects delete <project-id>           delete a project (admin) with its apps, service
                                         accounts, secrets and persistent storage
  service-accounts list                  list a project's service accounts
  service-accounts create <name>         create a service account and print its token once
      --expires-in <n>m|h|d              lifetime (default ${DEFAULT_EXPIRES_IN}; at most one year)
      --expires-at <RFC 3339 time>       or an exact expiry
  service-accounts delete <id>           delete a service account: its token stops working
  (sa is short for service-accounts)
  secrets list                           a project's secrets: names and times, never values
  secrets set <NAME>                     create a secret or give it a new value, read from
                                         stdin (one final line break dropped); the
                                         project's replicas are replaced to see it
  secrets delete <NAME>                  delete a secret

Options:
  -p, --project <id>   project of the app, service account and secret commands (default $SKIFF_PROJECT,
                       else a service account token's own project, else ${DEFAULT_PROJECT})
  --url <url>          skiff server (default $SKIFF_URL, else http://$SKIFF_HOST:$SKIFF_PORT
                       when SKIFF_PORT is set, else the address a running skiff wrote
                       into its data folder, else ${DEFAULT_URL})
  --token <token>      bearer token (default $SKIFF_TOKEN, else the admin token file
                       of the data folder, sent only to the address in that folder
                       or to a URL given with --url or SKIFF_URL)
  The data folder: $SKIFF_DATA_DIR, else .data of this folder or of the skiff checkout.
  --json               print JSON instead of tables
  -h, --help           show this help`;

const OPTIONS = {
  url: { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
  project: { type: "string", short: "p" },
  name: { type: "string" },
  "expires-in": { type: "string" },
  "expires-at": { type: "string" },
  run: { type: "string" },
  limit: { type: "string" },
  follow: { type: "boolean", short: "f" },
  data: { type: "string", short: "d" },
  async: { type: "boolean" },
  webhook: { type: "string" },
  "webhook-secret-file": { type: "string" },
  status: { type: "string" },
  app: { type: "string" },
} as const;
const GLOBAL = new Set(["url", "token", "json", "help"]);
const ALIASES: Record<string, string> = { sa: "service-accounts" };
const GROUPS: Record<string, Record<string, Command>> = { ...COMMANDS, apps, secrets };
/** Commands of one word, whose first positional is their argument. */
const SINGLE: Record<string, Command> = { deploy, logs, run, runs, "run-status": runStatus };

/** A refusal or failure of the server, said as a sentence with its HTTP status; never a code name. */
function explain(err: ConnectError, target: Target): string {
  switch (err.code) {
    case Code.Unavailable:
      return `cannot reach skiff at ${target.url} (from ${target.urlSource}): ${err.rawMessage}; is it running? Set --url, SKIFF_URL, SKIFF_PORT or SKIFF_DATA_DIR`;
    case Code.Unauthenticated:
      return `the server refused the token (401 unauthenticated: ${err.rawMessage}); token from ${target.tokenSource}`;
    case Code.PermissionDenied:
      return `not allowed (403): ${err.rawMessage}`;
    case Code.InvalidArgument:
      return `invalid request (400): ${err.rawMessage}`;
    case Code.FailedPrecondition:
      return `refused (400): ${err.rawMessage}`;
    case Code.ResourceExhausted:
      return `too large or too many (${err.rawMessage.includes("request body larger") ? 413 : 429}): ${err.rawMessage}`;
    case Code.NotFound:
      return `not found (404): ${err.rawMessage}`;
    case Code.AlreadyExists:
      return `already exists (409): ${err.rawMessage}`;
    case Code.Canceled:
      return `the call was cancelled: ${err.rawMessage}`;
    case Code.DeadlineExceeded:
      return `the call took too long (504): ${err.rawMessage}`;
    case Code.Aborted:
      return `the call was cut short by a conflicting change (409): ${err.rawMessage}`;
    case Code.OutOfRange:
      return `out of range (400): ${err.rawMessage}`;
    case Code.Unimplemented:
      return `the server at ${target.url} does not offer this call (is it skiff, and as new as this CLI?): ${err.rawMessage}`;
    case Code.Internal:
    case Code.DataLoss:
      return `the server failed (500): ${err.rawMessage}`;
    case Code.Unknown:
      return `the server answered with an error: ${err.rawMessage}`;
  }
}

export async function main(argv: string[]): Promise<number> {
  const out = (text: string) => process.stdout.write(text + "\n");
  const err = (text: string) => process.stderr.write(text + "\n");
  let target: Target | undefined;
  try {
    const { values, positionals } = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
    if (values.help) {
      out(USAGE);
      return 0;
    }
    const single = SINGLE[positionals[0]];
    const [groupWord, action, ...rest] = single ? [positionals[0], "", ...positionals.slice(1)] : positionals;
    const command = single ?? GROUPS[ALIASES[groupWord] ?? groupWord]?.[action];
    if (!command)
      throw new UsageError(
        groupWord === undefined ? "no command given" : `unknown command "${positionals.slice(0, 2).join(" ")}"`,
      );
    const words = single ? groupWord : `${groupWord} ${action}`;
    for (const [name, value] of Object.entries(values)) {
      if (value !== undefined && !GLOBAL.has(name) && !command.options.includes(name))
        throw new UsageError(`--${name} does not apply to "${words}"`);
    }
    if (rest.length > command.positionals) throw new UsageError(`unexpected argument "${rest[command.positionals]}"`);

    target = resolveTarget(values, process.env, process.cwd());
    if (target.token === undefined)
      throw new UsageError(
        "no token: pass --token, set SKIFF_TOKEN, or set SKIFF_DATA_DIR to the data folder of the skiff you started (it keeps admin-token there)",
      );
    const token = target.token;
    const transport = createConnectTransport({
      baseUrl: target.url,
      httpVersion: "1.1",
      interceptors: [bearerAuth(token)],
    });
    await command.run({
      client: createClient(ManagementService, transport),
      transport,
      options: values,
      positionals: rest,
      json: values.json === true,
      target: { url: target.url, token },
      out,
      err,
    });
    return 0;
  } catch (e) {
    if (
      e instanceof UsageError ||
      (e instanceof TypeError && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS"))
    ) {
      err(`skiff: ${e.message}\nRun "skiff --help" for usage.`);
      return 2;
    }
    // The CLI's own failures (an app that answered an error, a file it cannot read) say themselves.
    const message =
      target !== undefined && e instanceof ConnectError
        ? explain(e, target)
        : e instanceof Error
          ? e.message
          : String(e);
    err(`skiff: ${message}`);
    return 1;
  }
}

process.exitCode = await main(process.argv.slice(2));
