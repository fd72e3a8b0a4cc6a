// First start of `npm start`: deploys the example apps into p-dev, through
// the process's own API with the dev token like `skiff deploy` would, so a
// new user has something to call. An example that p-dev already has is left
// alone (redeploy it with `skiff deploy`).
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { packApp } from "../apps/index.js";
import { bearerAuth } from "../auth/index.js";
import type { Logger } from "../config/index.js";
import { DEV_PROJECT_ID, devTokenFile } from "./bootstrap.js";

const EXAMPLES_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples");
export const EXAMPLE_APPS = ["hello-python", "hello-node", "custom-http"];

export async function deployExamples(opts: { url: string; dataDir: string; logger: Logger }): Promise<void> {
  const token = (await readFile(devTokenFile(opts.dataDir), "utf8")).trim();
  const transport = createConnectTransport({
    baseUrl: opts.url,
    httpVersion: "1.1",
    interceptors: [bearerAuth(token)],
  });
  const client = createClient(ManagementService, transport);
  for (const name of EXAMPLE_APPS) {
    try {
      const exists = await client.getApp({ projectId: DEV_PROJECT_ID, appName: name }).then(
        () => true,
        (err: unknown) => {
          if (ConnectError.from(err).code === Code.NotFound) return false;
          throw err;
        },
      );
      if (exists) continue;
      const { bytes } = await packApp(path.join(EXAMPLES_DIR, name));
      const res = await client.deployApp({
        projectId: DEV_PROJECT_ID,
        bundle: { contentType: "application/gzip", data: bytes },
      });
      opts.logger.info(
        { app: name, project: DEV_PROJECT_ID, version: res.app?.deployment?.version },
        `deployed example app ${name} into ${DEV_PROJECT_ID}`,
      );
    } catch (err) {
      opts.logger.warn({ err, app: name }, `could not deploy example app ${name}`);
    }
  }
}
