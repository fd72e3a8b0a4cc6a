// Deploys an app folder given as file texts into p-dev of a skiff process,
// through DeployApp as `skiff deploy` does.
import { mkdtemp, writeFile } from "node:fs/promises";
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ManagementService } from "../gen/skiff/management/v2/management_pb.js";
import { packApp } from "../services/apps/bundle.js";
import { bearerAuth } from "../services/auth/bearer.js";

export async function deployFolder(
  skiff: { url: string; devToken: string },
  tmp: string,
  files: Record<string, string>,
): Promise<void> {
  const dir = await mkdtemp(path.join(tmp, "app-"));
  for (const [name, text] of Object.entries(files)) await writeFile(path.join(dir, name), text);
  const transport = createConnectTransport({
    baseUrl: skiff.url,
    httpVersion: "1.1",
    interceptors: [bearerAuth(skiff.devToken)],
  });
  await createClient(ManagementService, transport).deployApp({
    projectId: "p-dev",
    bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
  });
}
