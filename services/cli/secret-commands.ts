// `skiff secrets`: a project's secrets. The value of `secrets set` comes from
// stdin, never from the command line (where other users of the machine and
// the shell's history would see it), and is never printed.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { toJson } from "@bufbuild/protobuf";
import { ListSecretsResponseSchema, SetSecretResponseSchema } from "../../gen/skiff/management/v2/management_pb.js";
import { projectOf, UsageError, type Command } from "./commands.js";
import { table } from "./table.js";

const time = (t: Timestamp | undefined) => (t ? timestampDate(t).toISOString() : "");

/** All of stdin as UTF-8, less one final line break (what `echo` and a typed line add). */
async function readValue(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks)
    .toString("utf8")
    .replace(/\r?\n$/, "");
}

export const secrets: Record<string, Command> = {
  set: {
    options: ["project"],
    positionals: 1,
    async run(ctx) {
      const name = ctx.positionals[0];
      if (name === undefined)
        throw new UsageError(
          "secrets set needs a name, and reads the value from stdin: skiff secrets set <NAME> < file",
        );
      if (process.stdin.isTTY) ctx.err(`Type the value of ${name}, then Enter and Ctrl-D:`);
      const value = await readValue();
      // `printf '%s' "$TOKEN" | skiff secrets set …` with the variable unset sends nothing: not a value to keep.
      if (value === "")
        throw new Error(
          `the value of ${name} read from stdin is empty (an unset variable?); nothing was set. Pipe the value in: skiff secrets set ${name} < file`,
        );
      const projectId = projectOf(ctx);
      const res = await ctx.client.setSecret({ projectId, name, value });
      ctx.out(
        ctx.json
          ? JSON.stringify(toJson(SetSecretResponseSchema, res, { useProtoFieldName: true }), null, 2)
          : `${res.created ? "created" : "updated"} secret ${name} of project ${projectId}; the project's replicas are being replaced`,
      );
    },
  },
  list: {
    options: ["project"],
    positionals: 0,
    async run(ctx) {
      const res = await ctx.client.listSecrets({ projectId: projectOf(ctx) });
      ctx.out(
        ctx.json
          ? JSON.stringify(toJson(ListSecretsResponseSchema, res, { useProtoFieldName: true }), null, 2)
          : table(
              ["name", "created", "updated"],
              res.secrets.map((s) => [s.name, time(s.createdAt), time(s.updatedAt)]),
            ),
      );
    },
  },
  delete: {
    options: ["project"],
    positionals: 1,
    async run(ctx) {
      const name = ctx.positionals[0];
      if (name === undefined) throw new UsageError("secrets delete needs a name: skiff secrets delete <NAME>");
      await ctx.client.deleteSecret({ projectId: projectOf(ctx), name });
      ctx.out(ctx.json ? "{}" : `deleted secret ${name} of project ${projectOf(ctx)}`);
    },
  },
};
