// Apps in the shapes of the platform whose cerebrium.toml skiff reads,
// deployed with `skiff deploy <folder>` and through the API, and called over
// HTTP: a Cortex main.py that validates with pydantic and logs with loguru,
// and a FastAPI app under uvicorn. Their Python packages come from Debian
// (python3-pydantic, python3-loguru, python3-fastapi, uvicorn): listed in
// [cerebrium.dependencies.pip], they install offline, from what the machine
// has.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { c as createTar } from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../helpers/cli.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const P = "p-dev";

let t: TestSkiff;
let tmp: string;

const skiff = (args: string[]) => runCli(args, { env: { SKIFF_URL: t.url, SKIFF_TOKEN: t.devToken }, cwd: tmp });

async function writeFolder(name: string, files: Record<string, string>): Promise<string> {
  const dir = path.join(tmp, name);
  for (const [rel, body] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
    await writeFile(path.join(dir, rel), body);
  }
  return dir;
}

/** POSTs JSON to an app's path; retries while a fresh deployment's first replica starts. */
async function call(app: string, route: string, body: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(`${t.url}/v4/${P}/${app}/${route}`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // not JSON: kept as text
  }
  return { status: res.status, body: parsed };
}

/** Deploys a gzipped tar of `files` of a folder (as anything but `skiff deploy` would send it) through the API. */
async function deployByApi(dir: string, files: string[]): Promise<{ status: number; body: any }> {
  const chunks: Buffer[] = [];
  for await (const chunk of createTar({ gzip: true, cwd: dir, portable: true }, files))
    chunks.push(Buffer.from(chunk as Uint8Array));
  const res = await fetch(`${t.url}/v2/projects/${P}/apps`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/gzip" },
    body: Buffer.concat(chunks),
  });
  return { status: res.status, body: await res.json() };
}

const CORTEX_TOML = `[cerebrium.deployment]
name = "1-cortex-app"
python_version = "3.11"
include = ["./*", "main.py", "cerebrium.toml"]
exclude = [".*", "*.secret"]
shell_commands = ["echo built-by-shell > built.txt"]

[cerebrium.hardware]
cpu = 1
memory = 1.5
compute = "AMPERE_A10"
gpu_count = 1
provider = "aws"
region = "us-east-1"

[cerebrium.scaling]
min_replicas = 0
max_replicas = 2
cooldown = 10

[cerebrium.dependencies.pip]
pydantic = "latest"
loguru = "latest"
`;

const CORTEX_MAIN = `import os
from loguru import logger
from pydantic import BaseModel


class Item(BaseModel):
    prompt: str
    times: int = 1


def predict(prompt, times=1):
    item = Item(prompt=prompt, times=times)
    logger.info("predicting for {}", item.prompt)
    return {"echo": " ".join([item.prompt] * item.times)}


def files():
    with open("/cortex/built.txt") as f:
        built = f.read().strip()
    limit = [l for l in open("/proc/self/limits") if l.startswith("Max address space")][0].split()[3]
    return {
        "built": built,
        "secret_packed": os.path.exists("notes.secret"),
        "dotfile_packed": os.path.exists(".env"),
        "address_space": int(limit),
    }
`;

const CUSTOM_TOML = `[cerebrium.deployment]
name = "2-fastapi-server"
python_version = "3.11"
include = ["*"]
exclude = [".*"]

[cerebrium.runtime.custom]
port = 8000
entrypoint = ["uvicorn", "main:app", "--host", "0.0.0.0", "--port", "8000"]
healthcheck_endpoint = "/health"

[cerebrium.hardware]
cpu = 1
memory = 1.0
compute = "CPU"

[cerebrium.scaling]
min_replicas = 0
max_replicas = 1
replica_concurrency = 10

[cerebrium.dependencies.pip]
fastapi = "latest"
uvicorn = "latest"
pydantic = "latest"
`;

const CUSTOM_MAIN = `from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()


class Item(BaseModel):
    prompt: str


@app.get("/health")
def health():
    return "OK"


@app.post("/predict")
def predict(item: Item):
    return {"result": item.prompt.upper()}
`;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-cerebrium-"));
  t = await startTestSkiff();
});
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("cerebrium.toml - apps of that platform deploy and run as they are", () => {
  it("a Cortex main.py: named with a leading digit, pip dependencies from Debian offline, shell_commands, globs, /cortex, memory", async () => {
    const dir = await writeFolder("cortex", {
      "cerebrium.toml": CORTEX_TOML,
      "main.py": CORTEX_MAIN,
      "notes.secret": "not for the bundle",
      ".env": "NOT=packed",
    });
    const res = await skiff(["deploy", dir]);
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toBe(`deployed 1-cortex-app version 1 to project ${P}\n`);
    expect(res.stderr).toContain(
      "warning: cerebrium.toml:11: cerebrium.hardware.compute (and gpu_count, provider, region) are ignored",
    );
    const answer = await call("1-cortex-app", "predict", { prompt: "hi", times: 2 });
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ result: { echo: "hi hi" } });
    expect(typeof answer.body.run_id).toBe("string");
    const seen = await call("1-cortex-app", "files", {});
    expect(seen.body.result).toEqual({
      built: "built-by-shell",
      secret_packed: false,
      dotfile_packed: false,
      address_space: 1536 * 1024 * 1024,
    });
    // The deploy's warnings and its build commands' output are in the app's log, as replica "deploy".
    await expect
      .poll(async () => (await skiff(["logs", "1-cortex-app"])).stdout, { timeout: 20_000 })
      .toMatch(/ deploy ! warning: cerebrium\.toml:11: cerebrium\.hardware\.compute/);
    const logs = (await skiff(["logs", "1-cortex-app"])).stdout;
    expect(logs).toContain(" deploy running shell_commands[0]: echo built-by-shell > built.txt");
    // pydantic's validation error is the app's own: a failed run, as any exception.
    const bad = await call("1-cortex-app", "predict", { prompt: "x", times: "many" });
    expect(bad.status).toBeGreaterThanOrEqual(400);
  });

  it("a Custom FastAPI app under uvicorn on its fixed port, called with POST", async () => {
    const dir = await writeFolder("custom", { "cerebrium.toml": CUSTOM_TOML, "main.py": CUSTOM_MAIN });
    const res = await skiff(["deploy", dir]);
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toBe(`deployed 2-fastapi-server version 1 to project ${P}\n`);
    const answer = await call("2-fastapi-server", "predict", { prompt: "shout" });
    expect(answer).toEqual({ status: 200, body: { result: "SHOUT" } });
    const app = (await t.management().getApp({ projectId: P, appName: "2-fastapi-server" })).app!;
    expect(app.configFile).toBe("cerebrium.toml");
    expect(app.runtime).toMatchObject({ kind: "custom", port: 8000, healthcheck: "/health", cpu: 1, memoryMb: 1024 });
    const shown = await skiff(["apps", "get", "2-fastapi-server"]);
    expect(shown.stdout).toContain(
      "config:     cerebrium.toml; replica limits: cpu 1, memory 1024 MiB (at most the machine's SKIFF_REPLICA_MEMORY_MB)",
    );
  });

  it("through the API: the server applies the globs to what the bundle holds, and answers the warnings", async () => {
    const dir = await writeFolder("api", {
      "cerebrium.toml": CORTEX_TOML.replace('"1-cortex-app"', '"3-api-app"'),
      "main.py": CORTEX_MAIN,
      "notes.secret": "sent, and removed by the server",
      ".env": "NOT=kept",
    });
    const res = await deployByApi(dir, ["cerebrium.toml", "main.py", "notes.secret", ".env"]);
    expect(res.status).toBe(200);
    expect(res.body.app.app_name).toBe("3-api-app");
    expect(res.body.warnings).toEqual([
      "cerebrium.toml:11: cerebrium.hardware.compute (and gpu_count, provider, region) are ignored: replicas run on this machine's CPUs, without a GPU",
    ]);
    const seen = await call("3-api-app", "files", {});
    expect(seen.body.result).toMatchObject({ secret_packed: false, dotfile_packed: false });
    // More memory than a replica here gets: said at the deploy, not only by `skiff apps get`.
    const big = await writeFolder("api-big", {
      "cerebrium.toml": CORTEX_TOML.replace('"1-cortex-app"', '"3-api-app"').replace("memory = 1.5", "memory = 12.0"),
      "main.py": CORTEX_MAIN,
    });
    const bigger = await deployByApi(big, ["cerebrium.toml", "main.py"]);
    expect(bigger.status).toBe(200);
    expect(bigger.body.warnings).toContain(
      "cerebrium.toml: the app asks for 12288 MiB a replica; a replica here gets at most 2048 MiB (SKIFF_REPLICA_MEMORY_MB), which holds",
    );
  });

  it.each([
    [
      "a shell command that fails: its exit code and last lines",
      {
        "cerebrium.toml": `[cerebrium.deployment]\nname = "bad-shell"\nshell_commands = ["echo first", "echo broken-step >&2; exit 3"]\n`,
        "main.py": "def f():\n    return 1\n",
      },
      /cerebrium\.deployment\.shell_commands\[1\] \("echo broken-step >&2; exit 3"\) exited with 3; its last lines:\nbroken-step/,
    ],
    [
      "apt and conda packages the machine lacks: named",
      {
        "cerebrium.toml": `[cerebrium.deployment]\nname = "bad-apt"\n\n[cerebrium.dependencies.apt]\nlibskiff-nothing-here = "latest"\ncoreutils = "latest"\n\n[cerebrium.dependencies.conda]\nskiff-no-such-conda = "latest"\n`,
        "main.py": "def f():\n    return 1\n",
      },
      /does not have the system packages the app needs \(apt: libskiff-nothing-here; conda: skiff-no-such-conda\)/,
    ],
    [
      "an invalid value: file, line and key",
      {
        "cerebrium.toml": `[cerebrium.deployment]\nname = "bad-value"\n\n[cerebrium.scaling]\ncooldown = "soon"\n`,
        "main.py": "",
      },
      /invalid cerebrium\.toml:\ncerebrium\.toml:5: cerebrium\.scaling\.cooldown must be an integer, got a string \("soon"\)/,
    ],
    [
      "a Cortex app without main.py",
      { "cerebrium.toml": `[cerebrium.deployment]\nname = "no-main"\n`, "app.py": "" },
      /it is a Cortex app, and main\.py is not in the app folder/,
    ],
    [
      "a misspelt program in the entrypoint: said at the deploy, not as a 503 to the first call",
      {
        "cerebrium.toml": `[cerebrium.deployment]\nname = "typo-cmd"\n\n[cerebrium.runtime.custom]\nport = 8000\nentrypoint = ["pythonn", "main.py"]\n`,
        "main.py": "",
      },
      /the app's command "pythonn" is not a program on a replica's PATH \(\/usr\/local\/bin:\/usr\/bin:\/bin\) nor a file of the app folder/,
    ],
    [
      "a Dockerfile and no entrypoint",
      {
        "cerebrium.toml": `[cerebrium.deployment]\nname = "docker"\n\n[cerebrium.runtime.custom]\ndockerfile_path = "./Dockerfile"\n`,
        Dockerfile: "FROM x\n",
      },
      /cerebrium\.runtime\.custom\.entrypoint is required: skiff does not build the Dockerfile/,
    ],
  ])("refused: %s", async (name, files, message) => {
    const dir = await writeFolder(`refused-${name.length}-${name.slice(0, 8).replace(/\W/g, "")}`, files);
    const res = await deployByApi(dir, Object.keys(files));
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(message);
  });

  it("a folder with both skiff.toml and cerebrium.toml is refused by the CLI and by the API", async () => {
    const dir = await writeFolder("both", {
      "cerebrium.toml": `[cerebrium.deployment]\nname = "both"\n`,
      "skiff.toml": `[app]\nname = "both"\n`,
      "main.py": "",
    });
    const cli = await skiff(["deploy", dir]);
    expect(cli.code).not.toBe(0);
    expect(cli.stderr).toContain("has both skiff.toml and cerebrium.toml");
    const api = await deployByApi(dir, ["cerebrium.toml", "skiff.toml", "main.py"]);
    expect(api.status).toBe(400);
    expect(api.body.message).toContain("both skiff.toml and cerebrium.toml");
  });
});
