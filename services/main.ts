// The skiff process: `npm start` runs every role; `--roles a,b` picks some.
// With SKIFF_WORKERS > 1 it is the supervisor of that many workers
// (workers.ts), each of which runs this file again as a worker.
import cluster from "node:cluster";
import { existsSync } from "node:fs";
import { parseArgs } from "node:util";
import { ConfigError, loadConfig, parseRoles, createLogger, type Logger } from "./config/index.js";
import { lockDataFolder } from "./data-lock.js";
import { adminTokenFile, deployExamples, devTokenFile } from "./management/index.js";
import { startSkiff } from "./start.js";
import { superviseWorkers, workerNumber } from "./workers.js";

async function main(): Promise<void> {
  let config;
  try {
    const { values } = parseArgs({ options: { roles: { type: "string" } }, strict: true });
    config = loadConfig(process.env, {
      ...(values.roles === undefined ? {} : { roles: parseRoles(values.roles, "--roles") }),
      worker: workerNumber(),
    });
  } catch (err) {
    console.error(`skiff: ${err instanceof ConfigError || err instanceof TypeError ? err.message : String(err)}`);
    process.exit(2);
  }
  const base = createLogger(config.logLevel);
  // A worker's every line says which worker it is.
  const logger = config.worker === undefined ? base : base.child({ worker: config.worker });
  // One process per data folder: taken before anything in it is touched (a supervisor's workers use its folder).
  let releaseDataFolder = async () => {};
  if (config.worker === undefined) {
    try {
      releaseDataFolder = await lockDataFolder(config.dataDir);
    } catch (err) {
      cannotGoOn(logger, "cannot start: ", err);
    }
  }
  if (config.workers > 1 && cluster.isPrimary) return superviseWorkers(config, logger);
  // Taken from the start: a signal while skiff starts (it says it serves before this function goes on) is held,
  // and the stop begins once it has started, instead of the signal's default ending the process at once.
  let signalled: string | undefined;
  let onSignal: (signal: string) => void = (signal) => void (signalled ??= signal);
  process.on("SIGTERM", () => onSignal("SIGTERM"));
  process.on("SIGINT", () => onSignal("SIGINT"));
  let skiff;
  try {
    skiff = await startSkiff(config, logger);
  } catch (err) {
    cannotGoOn(logger, "cannot start: ", err);
  }
  // At a terminal, the few lines a person looks for among the JSON log lines (stdout, for machines).
  if (process.stderr.isTTY && config.worker === undefined) console.error(banner(skiff.url, config));
  // In the background once the port is open: the server must answer the deploys.
  // Once per install: by worker 1 where several serve.
  if (config.roles.includes("management") && config.roles.includes("runner") && (config.worker ?? 1) === 1)
    void deployExamples({ url: skiff.url, dataDir: config.dataDir, logger });
  let stopping = false;
  // The nats-server skiff started is its state: without it nothing can be recorded or queued. One that ends
  // on its own (killed, out of memory) ends skiff too, loudly, for whatever supervises it to start both again.
  void skiff.nats.serverExited?.then(() => {
    if (stopping) return;
    const pid = skiff.nats.serverPid;
    cannotGoOn(
      logger,
      "",
      new Error(
        `the nats-server this skiff started (pid ${pid}) ended on its own; skiff cannot go on without it and exits: start it again`,
      ),
    );
  });
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info(
      { signal, stopDeadlineMs: config.stopDeadlineMs },
      "stopping: no new requests, finishing in-flight ones",
    );
    // A stop that cannot finish (NATS gone, a blocked read) ends here, saying what it still waited for.
    setTimeout(() => {
      const waitingFor = skiff.waitingFor();
      logger.error(
        { waitingFor, stopDeadlineMs: config.stopDeadlineMs },
        `stop deadline passed (SKIFF_STOP_DEADLINE_MS=${config.stopDeadlineMs}): exiting with code 1, still waiting for ${waitingFor.join("; ") || "nothing named"}`,
      );
      process.exit(1);
    }, config.stopDeadlineMs);
    skiff.close().then(
      async () => {
        await releaseDataFolder().catch(() => undefined);
        logger.info("stopped");
        process.exit(0);
      },
      (err) => {
        logger.error({ err }, "unclean stop");
        process.exit(1);
      },
    );
  };
  onSignal = stop;
  if (signalled !== undefined) stop(signalled);
}

/** Ends the process with exit code 1: why, in the log (for machines) and as a sentence on stderr. */
function cannotGoOn(logger: Logger, prefix: string, err: unknown): never {
  const message = err instanceof Error ? err.message : String(err);
  logger.fatal({ err }, message);
  console.error(`skiff: ${prefix}${message}`);
  process.exit(1);
}

/** Where to go next: the address, the dashboard, the token files that exist, the CLI. */
function banner(url: string, config: { dataDir: string; roles: readonly string[] }): string {
  const lines = [`skiff serves ${url}`];
  if (config.roles.includes("management")) lines.push(`  dashboard    ${url}/`);
  const admin = adminTokenFile(config.dataDir);
  if (existsSync(admin)) lines.push(`  admin token  ${admin} (every project; the dashboard's sign-in)`);
  const dev = devTokenFile(config.dataDir);
  if (existsSync(dev)) lines.push(`  dev token    ${dev} (project p-dev)`);
  lines.push("  CLI          npx skiff --help");
  return lines.join("\n");
}

void main();
