import { mkdtemp, mkdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AppConfigError, type AppConfig, DEFAULT_RESPONSE_GRACE_PERIOD } from "../../services/apps/app-config.js";
import { fileSelection, inspectBundle, packApp } from "../../services/apps/bundle.js";
import { parseCerebriumConfig, splitCommandLine } from "../../services/apps/cerebrium-config.js";
import { configFileOf, removeUnselected } from "../../services/apps/config-file.js";
import { parseAppConfig } from "../../services/apps/app-config.js";

const MINIMAL = `[cerebrium.deployment]\nname = "1-first-cortex-deployment"\n`;

/** Every key that file format has, in one config. */
const EVERY_KEY = `[cerebrium.deployment]
name = "all-keys"
python_version = "3.11"
include = ["./*", "main.py", "cerebrium.toml"]
exclude = [".*", "secret/"]
shell_commands = ["echo built > built.txt", ""]
pre_build_commands = ["echo before"]
docker_base_image_url = "debian:bookworm-slim"
disable_auth = true

[cerebrium.runtime.custom]
entrypoint = ["uvicorn", "main:app", "--host", "0.0.0.0", "--port", "8000"]
port = 8000
healthcheck_endpoint = "/health"
readycheck_endpoint = "/ready"

[cerebrium.hardware]
cpu = 2
memory = 4.5
compute = "CPU"
gpu_count = 0
provider = "aws"
region = "us-east-1"

[cerebrium.scaling]
min_replicas = 1
max_replicas = 3
cooldown = 10
replica_concurrency = 100
response_grace_period = 600
scaling_metric = "concurrency_utilization"

[cerebrium.dependencies.pip]
pydantic = "latest"
fastapi = ">=0.90"
loguru = "0.6.0"

[cerebrium.dependencies.npm]
left-pad = "1.3.0"

[cerebrium.dependencies.apt]
ffmpeg = "latest"

[cerebrium.dependencies.conda]
numpy = "latest"

[cerebrium.dependencies.paths]
pip = "requirements.txt"
apt = "pkglist.txt"
`;

function issues(text: string): string[] {
  try {
    parseCerebriumConfig(text, { machinePython: "3.11.2" });
  } catch (err) {
    expect(err).toBeInstanceOf(AppConfigError);
    return (err as AppConfigError).message.split("\n");
  }
  throw new Error("the config was accepted");
}

describe("cerebrium.toml - parsed to the AppConfig of skiff.toml", () => {
  it("a name and nothing else: a Cortex app with main.py, a leading digit allowed, skiff's defaults", () => {
    const { config, warnings } = parseCerebriumConfig(MINIMAL, { machinePython: "3.11.2" });
    expect(config).toMatchObject<Partial<AppConfig>>({
      app: { name: "1-first-cortex-deployment" },
      runtime: { kind: "cortex", language: "python", entry: "main.py" },
      source: "cerebrium.toml",
      files: { include: ["*"], exclude: [".*"] },
    });
    expect(config.scaling.responseGracePeriod).toBe(DEFAULT_RESPONSE_GRACE_PERIOD);
    expect(config.resources).toBeUndefined();
    expect(warnings).toEqual([]);
  });

  it("every key: what skiff honours is in the config, what it ignores is a warning with its line", () => {
    const { config, warnings } = parseCerebriumConfig(EVERY_KEY, { machinePython: "3.11.2" });
    expect(config).toEqual<AppConfig>({
      app: { name: "all-keys" },
      runtime: {
        kind: "custom",
        command: ["uvicorn", "main:app", "--host", "0.0.0.0", "--port", "8000"],
        healthcheck: "/health",
        readycheck: "/ready",
        port: 8000,
      },
      env: {},
      scaling: { minReplicas: 1, maxReplicas: 3, replicaConcurrency: 100, cooldown: 10, responseGracePeriod: 600 },
      source: "cerebrium.toml",
      build: {
        preBuildCommands: ["echo before"],
        shellCommands: ["echo built > built.txt"],
        pip: ["pydantic", "fastapi>=0.90", "loguru==0.6.0"],
        pipFiles: ["requirements.txt"],
        npm: ["left-pad@1.3.0"],
        apt: ["ffmpeg"],
        conda: ["numpy"],
        aptFiles: ["pkglist.txt"],
        condaFiles: [],
      },
      files: { include: ["*", "main.py", "cerebrium.toml"], exclude: [".*", "secret/"] },
      resources: { cpu: 2, memoryMb: 4608 },
    });
    expect(warnings).toEqual([
      "cerebrium.toml:8: cerebrium.deployment.docker_base_image_url is ignored: replicas run on this machine's own system, not in a base image",
      "cerebrium.toml:9: cerebrium.deployment.disable_auth is ignored: every call to skiff needs a token",
      "cerebrium.toml:22: cerebrium.hardware.provider (and region) are ignored: replicas run on this machine's CPUs, without a GPU",
      "cerebrium.toml:31: cerebrium.scaling.scaling_metric is not a key skiff knows; it is ignored",
    ]);
  });

  it("a python_version of another minor version than the machine's is a warning, not a failure", () => {
    const text = MINIMAL + 'python_version = "3.12"\n';
    expect(parseCerebriumConfig(text, { machinePython: "3.11.2" }).warnings).toEqual([
      "cerebrium.toml:3: cerebrium.deployment.python_version asks for Python 3.12; this machine serves the app with its own Python 3.11.2",
    ]);
    expect(parseCerebriumConfig(text, { machinePython: "3.12.1" }).warnings).toEqual([]);
  });

  it("unknown keys and tables warn and never fail", () => {
    const text = `${MINIMAL}colour = "blue"\n\n[cerebrium.build]\nx = 1\n\n[tool.other]\ny = 2\n\n[cerebrium.runtime.cortex]\nthing = 1\n`;
    const { config, warnings } = parseCerebriumConfig(text, { machinePython: "3.11.2" });
    expect(config.runtime.kind).toBe("cortex");
    expect(warnings).toEqual([
      "cerebrium.toml:3: cerebrium.deployment.colour is not a key skiff knows; it is ignored",
      "cerebrium.toml:5: cerebrium.build is not a table skiff knows; it is ignored",
      "cerebrium.toml:8: tool is not a table skiff knows (its tables are under [cerebrium]); it is ignored",
      "cerebrium.toml:12: cerebrium.runtime.cortex.thing is not a key skiff knows; it is ignored",
    ]);
  });

  it("a refusal lists the names skiff did not know, with the known one each is closest to: the usual reason", () => {
    const refusal = (text: string) => {
      try {
        parseCerebriumConfig(text, { machinePython: "3.11.2" });
      } catch (err) {
        return (err as AppConfigError).issues.map((i) => i.message);
      }
      throw new Error("not refused");
    };
    expect(refusal('[cerebrium.deploymnet]\nname = "c1"\n')).toEqual([
      'cerebrium.deployment is required: [cerebrium.deployment] with name = "..."',
      "cerebrium.deployment.name is required",
      "cerebrium.deploymnet is not a table skiff knows (did you mean cerebrium.deployment?); it is ignored",
    ]);
    expect(refusal('[cerebrium.deployment]\nnmae = "c1"\n')).toEqual([
      expect.stringMatching(/^cerebrium\.deployment\.name is required/),
      "cerebrium.deployment.nmae is not a key skiff knows (did you mean cerebrium.deployment.name?); it is ignored",
    ]);
  });

  it("an entrypoint given as a string is split like a command line, without a shell", () => {
    const text = `${MINIMAL}\n[cerebrium.runtime.custom]\nentrypoint = "python -m http.server 'a b' \\"c;d\\" $HOME"\n`;
    const { config } = parseCerebriumConfig(text);
    expect(config.runtime).toMatchObject({
      kind: "custom",
      command: ["python", "-m", "http.server", "a b", "c;d", "$HOME"],
    });
    expect(splitCommandLine("a 'unclosed")).toBeUndefined();
  });

  it("what asks for what skiff does anyway does not warn; a Dockerfile beside a main.py warns and runs the main.py", () => {
    const quiet = `${MINIMAL}disable_auth = false\n\n[cerebrium.hardware]\ncompute = "CPU"\ngpu_count = 0\n\n[cerebrium.runtime.custom]\nentrypoint = "python main.py"\nreadycheck_endpoint = ""\n`;
    const parsed = parseCerebriumConfig(quiet, { machinePython: "3.11.2" });
    expect(parsed.warnings).toEqual([]);
    expect(parsed.config.runtime).toEqual({ kind: "custom", command: ["python", "main.py"], healthcheck: "/health" });
    const docker = parseCerebriumConfig(`${MINIMAL}dockerfile = "./Dockerfile"\n`, { machinePython: "3.11.2" });
    expect(docker.config.runtime).toEqual({ kind: "cortex", language: "python", entry: "main.py" });
    expect(docker.warnings).toEqual([
      "cerebrium.toml:3: cerebrium.deployment.dockerfile is ignored: skiff does not build images; the app runs as a Cortex app with its main.py",
    ]);
  });

  it("a cooldown of 0 is taken as 1 second, with a warning", () => {
    const { config, warnings } = parseCerebriumConfig(`${MINIMAL}\n[cerebrium.scaling]\ncooldown = 0\n`);
    expect(config.scaling.cooldown).toBe(1);
    expect(warnings).toEqual([
      "cerebrium.toml:5: cerebrium.scaling.cooldown of 0 is taken as 1 second, the shortest skiff has",
    ]);
  });

  it.each([
    [
      "no name",
      `[cerebrium.deployment]\npython_version = "3.11"\n`,
      "cerebrium.toml:1: cerebrium.deployment.name is required",
    ],
    ["no [cerebrium] at all", `[app]\nname = "x"\n`, "cerebrium.toml:1: cerebrium is required"],
    [
      "an upper-case name",
      `[cerebrium.deployment]\nname = "Hello"\n`,
      'cerebrium.toml:2: cerebrium.deployment.name must be 1 to 63 lowercase letters, digits or "-", starting with a letter or a digit, got "Hello"',
    ],
    [
      "a cooldown that is a string",
      `${MINIMAL}\n[cerebrium.scaling]\ncooldown = "10"\n`,
      'cerebrium.toml:5: cerebrium.scaling.cooldown must be an integer, got a string ("10")',
    ],
    [
      "a grace period over 12 h",
      `${MINIMAL}\n[cerebrium.scaling]\nresponse_grace_period = 50000\n`,
      "cerebrium.toml:5: cerebrium.scaling.response_grace_period must be between 1 and 43200, got 50000",
    ],
    [
      "min above max",
      `${MINIMAL}\n[cerebrium.scaling]\nmin_replicas = 3\nmax_replicas = 2\n`,
      "cerebrium.toml:5: cerebrium.scaling.min_replicas must not be more than cerebrium.scaling.max_replicas (2), got 3",
    ],
    [
      "memory as a string",
      `${MINIMAL}\n[cerebrium.hardware]\nmemory = "8GB"\n`,
      'cerebrium.toml:5: cerebrium.hardware.memory must be a number, got a string ("8GB")',
    ],
    [
      "cpu of 0",
      `${MINIMAL}\n[cerebrium.hardware]\ncpu = 0\n`,
      "cerebrium.toml:5: cerebrium.hardware.cpu must be between 0.01 and 1024, got 0",
    ],
    [
      "include that is a string",
      `${MINIMAL}include = "*"\n`,
      'cerebrium.toml:3: cerebrium.deployment.include must be an array of strings, got a string ("*")',
    ],
    [
      "shell_commands with a number",
      `${MINIMAL}shell_commands = ["ls", 3]\n`,
      "cerebrium.toml:3: cerebrium.deployment.shell_commands must be an array of strings, got an array",
    ],
    [
      "an entrypoint of numbers",
      `${MINIMAL}\n[cerebrium.runtime.custom]\nentrypoint = [1, 2]\n`,
      "cerebrium.toml:5: cerebrium.runtime.custom.entrypoint must be a non-empty array of strings (or a command line) whose first item names the program, got an array",
    ],
    [
      "a custom runtime without an entrypoint",
      `${MINIMAL}\n[cerebrium.runtime.custom]\nport = 8000\n`,
      'cerebrium.toml:4: cerebrium.runtime.custom.entrypoint is required for a custom runtime, e.g. ["uvicorn", "main:app"]',
    ],
    [
      "a Dockerfile and no entrypoint",
      `${MINIMAL}\n[cerebrium.runtime.custom]\ndockerfile_path = "./Dockerfile"\n`,
      "cerebrium.toml:4: cerebrium.runtime.custom.entrypoint is required: skiff does not build the Dockerfile, so it needs the command that starts the server",
    ],
    [
      "a port out of range",
      `${MINIMAL}\n[cerebrium.runtime.custom]\nentrypoint = ["x"]\nport = 70000\n`,
      "cerebrium.toml:6: cerebrium.runtime.custom.port must be between 1 and 65535, got 70000",
    ],
    [
      "a healthcheck that is not a path",
      `${MINIMAL}\n[cerebrium.runtime.custom]\nentrypoint = ["x"]\nhealthcheck_endpoint = "health"\n`,
      'cerebrium.toml:6: cerebrium.runtime.custom.healthcheck_endpoint must be a URL path starting with "/", got "health"',
    ],
    [
      "an unknown runtime",
      `${MINIMAL}\n[cerebrium.runtime.python]\nx = 1\n`,
      'cerebrium.toml:4: cerebrium.runtime.python is not a runtime skiff runs: use [cerebrium.runtime.custom] or "cortex"',
    ],
    [
      "a pip version that is a number",
      `${MINIMAL}\n[cerebrium.dependencies.pip]\nnumpy = 1.2\n`,
      'cerebrium.toml:5: cerebrium.dependencies.pip.numpy must be a version string ("latest", "1.2.3", ">=1.0"), got a number (1.2)',
    ],
    [
      "a pip requirement that smuggles an option",
      `${MINIMAL}\n[cerebrium.dependencies.pip]\nnumpy = "1.0\\n-r /etc/passwd"\n`,
      'cerebrium.toml:5: cerebrium.dependencies.pip.numpy is not a version pip reads: "1.0\\n-r /etc/passwd"',
    ],
    [
      "a pip name that is an option",
      `${MINIMAL}\n[cerebrium.dependencies.pip]\n"--index-url" = "latest"\n`,
      "cerebrium.toml:5: cerebrium.dependencies.pip.--index-url is not a package name",
    ],
    [
      "paths.pip outside the folder",
      `${MINIMAL}\n[cerebrium.dependencies.paths]\npip = "../requirements.txt"\n`,
      'cerebrium.toml:5: cerebrium.dependencies.paths.pip must be a relative path inside the app folder, got "../requirements.txt"',
    ],
    ["bad TOML", `[cerebrium.deployment\nname = "x"\n`, "cerebrium.toml:1: invalid TOML at line 1"],
  ])("refused: %s", (_name, text, first) => {
    expect(issues(text)[0]).toContain(first);
  });

  it("every problem is reported at once, in line order", () => {
    const text = `[cerebrium.deployment]\nname = "Bad"\n\n[cerebrium.scaling]\ncooldown = "x"\nmax_replicas = 0\n`;
    expect(issues(text)).toEqual([
      'cerebrium.toml:2: cerebrium.deployment.name must be 1 to 63 lowercase letters, digits or "-", starting with a letter or a digit, got "Bad"',
      'cerebrium.toml:5: cerebrium.scaling.cooldown must be an integer, got a string ("x")',
      "cerebrium.toml:6: cerebrium.scaling.max_replicas must be between 1 and 100, got 0",
    ]);
  });

  it("skiff.toml takes a name that starts with a digit too", () => {
    const text = `[app]\nname = "1-app"\n\n[runtime]\nkind = "cortex"\nlanguage = "python"\nentry = "main.py"\n`;
    expect(parseAppConfig(text).app.name).toBe("1-app");
  });
});

describe("cerebrium.toml - the folder and its bundle", () => {
  let tmp: string;
  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-cerebrium-"));
  });
  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  async function folder(name: string, files: Record<string, string>): Promise<string> {
    const dir = path.join(tmp, name);
    for (const [rel, body] of Object.entries(files)) {
      await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
      await writeFile(path.join(dir, rel), body);
    }
    return dir;
  }

  it("a folder with both files is refused, naming both", async () => {
    const dir = await folder("both", { "skiff.toml": "", "cerebrium.toml": MINIMAL, "main.py": "" });
    await expect(configFileOf(dir)).rejects.toThrow(/both skiff\.toml and cerebrium\.toml/);
    await expect(packApp(dir)).rejects.toThrow(/has both skiff\.toml and cerebrium\.toml/);
  });

  it("a bundle with both files is refused, naming both", async () => {
    const dir = await folder("both-bundle", { "skiff.toml": "", "main.py": "" });
    const { bytes } = await packApp(dir);
    await writeFile(path.join(dir, "cerebrium.toml"), MINIMAL);
    await rm(path.join(dir, "skiff.toml"));
    const other = await packApp(dir);
    // Two bundles' tars joined make one bundle with both files.
    const { gunzipSync, gzipSync } = await import("node:zlib");
    const tarA = gunzipSync(bytes);
    const tarB = gunzipSync(other.bytes);
    const joined = gzipSync(Buffer.concat([tarA.subarray(0, tarA.length - 1024), tarB]));
    await expect(inspectBundle(joined, { maxBytes: 1 << 20 })).rejects.toThrow(
      /has both skiff\.toml and cerebrium\.toml at its root/,
    );
    expect((await inspectBundle(other.bytes, { maxBytes: 1 << 20 })).entries).toContain("cerebrium.toml");
  });

  it("include/exclude choose what skiff deploy packs; the config file is always packed", async () => {
    const dir = await folder("globs", {
      "cerebrium.toml": `${MINIMAL}include = ["./*.py", "src"]\nexclude = [".*", "src/*.tmp"]\n`,
      "main.py": "",
      "notes.md": "",
      ".env": "SECRET=1",
      "src/a.py": "",
      "src/b.tmp": "",
      "data/big.bin": "",
    });
    expect((await packApp(dir)).files).toEqual(["cerebrium.toml", "main.py", "src/a.py"]);
  });

  it("the server removes what the globs leave out from a bundle packed by anything else, links without following them", async () => {
    const dir = await folder("unpacked", {
      "main.py": "",
      "keep/a.py": "",
      ".env": "x",
      "keep/b.log": "",
      "out.txt": "",
    });
    await symlink("/etc/passwd", path.join(dir, "link.txt"));
    const files = { include: ["*.py", "keep", "link.txt"], exclude: [".*", "*.log"] };
    expect(await removeUnselected(dir, { files })).toBe(3);
    const { readdir } = await import("node:fs/promises");
    expect((await readdir(dir, { recursive: true })).sort()).toEqual(["keep", "keep/a.py", "link.txt", "main.py"]);
    expect(fileSelection(undefined)("anything")).toBe(true);
  });
});
