// gRPC as tools that skiff did not write see it: server reflection (v1 and
// v1alpha) lets `buf curl` list and call the services without --schema, an
// unknown method answers gRPC's UNIMPLEMENTED, and grpc-message is
// percent-encoded only where the gRPC spec asks.
import { execFile } from "node:child_process";
import http2 from "node:http2";
import path from "node:path";
import { promisify } from "node:util";
import { create, createFileRegistry, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ServerReflection,
  type ServerReflectionResponse,
  ServerReflectionRequestSchema,
} from "../../gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflection as ServerReflectionAlpha,
  ServerReflectionRequestSchema as AlphaRequestSchema,
} from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { GetProjectRequestSchema } from "../../gen/skiff/management/v2/management_pb.js";
import { encodeGrpcMessage } from "../../services/server/grpc-status.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { TEST_ROOT } from "../helpers/paths.js";

const run = promisify(execFile);
const root = path.join(TEST_ROOT, "..");
const buf = path.join(root, "node_modules", ".bin", "buf");

interface RawAnswer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  data: Buffer;
}

/** One gRPC call over h2c with a hand-made frame, to see the wire as any gRPC client does. */
function grpcCall(url: string, procedure: string, message: Uint8Array, headers: Record<string, string> = {}) {
  return new Promise<RawAnswer>((resolve, reject) => {
    const session = http2.connect(url);
    session.on("error", reject);
    const stream = session.request({
      ":method": "POST",
      ":path": procedure,
      "content-type": "application/grpc",
      te: "trailers",
      ...headers,
    });
    const frame = Buffer.alloc(5 + message.length);
    frame.writeUInt32BE(message.length, 1);
    frame.set(message, 5);
    let status = 0;
    let responseHeaders: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    stream.on("response", (h) => {
      status = Number(h[":status"]);
      responseHeaders = h;
    });
    stream.on("trailers", (t) => (trailers = t));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("error", reject);
    stream.on("close", () => {
      session.close();
      resolve({ status, headers: responseHeaders, trailers, data: Buffer.concat(chunks) });
    });
    stream.end(frame);
  });
}

async function reflect(
  t: TestSkiff,
  requests: MessageInitShape<typeof ServerReflectionRequestSchema>[],
): Promise<ServerReflectionResponse[]> {
  const client = createClient(ServerReflection, createGrpcTransport({ baseUrl: t.url }));
  async function* send() {
    for (const r of requests) yield create(ServerReflectionRequestSchema, r);
  }
  const out: ServerReflectionResponse[] = [];
  for await (const res of client.serverReflectionInfo(send())) out.push(res);
  return out;
}

function fileNames(res: ServerReflectionResponse): string[] {
  if (res.messageResponse.case !== "fileDescriptorResponse") throw new Error(`not files: ${res.messageResponse.case}`);
  return res.messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b).name);
}

describe("gRPC server reflection", () => {
  let t: TestSkiff;
  beforeAll(async () => {
    t = await startTestSkiff();
  });
  afterAll(async () => {
    await t?.close();
  });

  it("buf curl without --schema lists every method, without a token", async () => {
    const { stdout } = await run(buf, [
      "curl",
      "--protocol",
      "grpc",
      "--http2-prior-knowledge",
      "--list-methods",
      t.url,
    ]);
    const methods = stdout.trim().split("\n");
    expect(methods).toContain("skiff.management.v2.ManagementService/ListProjects");
    expect(methods).toContain("skiff.management.v2.ManagementService/WatchRuns");
    expect(methods).toContain("skiff.invocation.v4.InvocationService/Run");
    expect(methods).toContain("grpc.health.v1.Health/Check");
    expect(methods).toContain("grpc.reflection.v1.ServerReflection/ServerReflectionInfo");
  });

  it("buf curl without --schema calls a method (the call itself needs its token)", async () => {
    const url = `${t.url}/skiff.management.v2.ManagementService/ListProjects`;
    const args = ["curl", "--protocol", "grpc", "--http2-prior-knowledge"];
    const { stdout } = await run(buf, [...args, "-H", `Authorization: Bearer ${t.adminToken}`, url]);
    const answer = JSON.parse(stdout) as { projects: { projectId: string }[] };
    expect(answer.projects.map((p) => p.projectId)).toContain("p-dev");
    const refused = await run(buf, [...args, url]).then(
      () => "",
      (err: { stderr?: string }) => err.stderr ?? "",
    );
    expect(refused).toMatch(/unauthenticated/);
  });

  it("file_containing_symbol answers the file and its dependencies, each once per stream; they resolve into a registry", async () => {
    const symbol = "skiff.management.v2.ManagementService.ListProjects";
    const [first, second] = await reflect(t, [
      { host: "x", messageRequest: { case: "fileContainingSymbol", value: symbol } },
      { messageRequest: { case: "fileContainingSymbol", value: "skiff.management.v2.Project" } },
    ]);
    const names = fileNames(first);
    expect(names[0]).toBe("skiff/management/v2/management.proto");
    expect(names).toEqual(
      expect.arrayContaining([
        "google/api/annotations.proto",
        "google/api/http.proto",
        "google/api/httpbody.proto",
        "google/protobuf/descriptor.proto",
        "google/protobuf/timestamp.proto",
      ]),
    );
    expect(first.validHost).toBe("x");
    // The same file again, without the dependencies already sent.
    expect(fileNames(second)).toEqual(["skiff/management/v2/management.proto"]);

    const files = (first.messageResponse.value as { fileDescriptorProto: Uint8Array[] }).fileDescriptorProto.map((b) =>
      fromBinary(FileDescriptorProtoSchema, b),
    );
    const byName = new Map(files.map((f) => [f.name, f]));
    const registry = createFileRegistry(files[0], (name) => byName.get(name));
    expect(registry.getService("skiff.management.v2.ManagementService")?.methods.length).toBeGreaterThan(10);
  });

  it("list_services, file_by_filename and extensions answer; an unknown name is NOT_FOUND", async () => {
    const [list, byName, missing, numbers, extension] = await reflect(t, [
      { messageRequest: { case: "listServices", value: "" } },
      { messageRequest: { case: "fileByFilename", value: "grpc/health/v1/health.proto" } },
      { messageRequest: { case: "fileContainingSymbol", value: "no.such.Thing" } },
      { messageRequest: { case: "allExtensionNumbersOfType", value: "google.protobuf.MethodOptions" } },
      {
        messageRequest: {
          case: "fileContainingExtension",
          value: { containingType: "google.protobuf.MethodOptions", extensionNumber: 72295728 },
        },
      },
    ]);
    expect(list.messageResponse.case).toBe("listServicesResponse");
    const services = (list.messageResponse.value as { service: { name: string }[] }).service.map((s) => s.name);
    expect(services).toEqual([
      "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection",
      "grpc.reflection.v1alpha.ServerReflection",
      "skiff.invocation.v4.InvocationService",
      "skiff.management.v2.ManagementService",
    ]);
    expect(fileNames(byName)).toEqual(["grpc/health/v1/health.proto"]);
    expect(missing.messageResponse).toMatchObject({ case: "errorResponse", value: { errorCode: Code.NotFound } });
    expect(numbers.messageResponse).toMatchObject({
      case: "allExtensionNumbersResponse",
      value: { extensionNumber: [72295728] },
    });
    expect(fileNames(extension)[0]).toBe("google/api/annotations.proto");
  });

  it("v1alpha answers the same", async () => {
    const client = createClient(ServerReflectionAlpha, createGrpcTransport({ baseUrl: t.url }));
    async function* send() {
      yield create(AlphaRequestSchema, { messageRequest: { case: "listServices", value: "" } });
    }
    const answers = [];
    for await (const res of client.serverReflectionInfo(send())) answers.push(res);
    expect(answers).toHaveLength(1);
    expect(answers[0].messageResponse.case).toBe("listServicesResponse");
    const services = (answers[0].messageResponse.value as { service: { name: string }[] }).service.map((s) => s.name);
    expect(services).toContain("skiff.management.v2.ManagementService");
    // The v1 request type reads the same bytes: one message shape, two packages.
    expect(toBinary(AlphaRequestSchema, create(AlphaRequestSchema, { host: "h" }))).toEqual(
      toBinary(ServerReflectionRequestSchema, create(ServerReflectionRequestSchema, { host: "h" })),
    );
  });
});

describe("gRPC status on the wire", () => {
  let t: TestSkiff;
  beforeAll(async () => {
    t = await startTestSkiff();
  });
  afterAll(async () => {
    await t?.close();
  });

  it("an unknown gRPC method answers HTTP 200 with grpc-status 12 in a trailers-only response", async () => {
    const answer = await grpcCall(t.url, "/no.such.Service/Nope", new Uint8Array(0));
    expect(answer.status).toBe(200);
    expect(answer.headers["grpc-status"]).toBe("12");
    expect(answer.headers["grpc-message"]).toBe("unknown method /no.such.Service/Nope");
    expect(answer.data.length).toBe(0);
    // And to a grpc client library:
    const { stderr } = await run(buf, [
      "curl",
      "--schema",
      "proto",
      "--protocol",
      "grpc",
      "--http2-prior-knowledge",
      `${t.url}/grpc.health.v1.Health/Nope`,
    ]).catch((err: { stderr: string }) => ({ stderr: err.stderr }));
    expect(stderr).toMatch(/unimplemented|not find|Nope/i);
  });

  it("an unknown gRPC-Web method answers HTTP 200 with grpc-status 12 too", async () => {
    const res = await fetch(`${t.url}/no.such.Service/Nope`, {
      method: "POST",
      headers: { "content-type": "application/grpc-web+proto" },
      body: new Uint8Array(5),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("grpc-status")).toBe("12");
  });

  it("grpc-message is percent-encoded only where the spec asks: non-ASCII bytes and %, not spaces or punctuation", async () => {
    const missing = await grpcCall(t.url, "/skiff.management.v2.ManagementService/ListProjects", new Uint8Array(0));
    const status = missing.trailers["grpc-status"] ?? missing.headers["grpc-status"];
    const message = missing.trailers["grpc-message"] ?? missing.headers["grpc-message"];
    expect(status).toBe(String(Code.Unauthenticated));
    expect(message).toBe("missing bearer token: send Authorization: Bearer <token>");

    const bad = await grpcCall(
      t.url,
      "/skiff.management.v2.ManagementService/GetProject",
      toBinary(GetProjectRequestSchema, create(GetProjectRequestSchema, { projectId: "p-ü 100%" })),
      { authorization: `Bearer ${t.adminToken}` },
    );
    const badMessage = String(bad.trailers["grpc-message"] ?? bad.headers["grpc-message"]);
    expect(badMessage).toContain('got "p-%C3%BC 100%25"');
    expect(decodeURIComponent(badMessage)).toContain('got "p-ü 100%"');
  });

  it("encodeGrpcMessage leaves printable ASCII but % as it is", () => {
    expect(encodeGrpcMessage("a b/c:d<e>~")).toBe("a b/c:d<e>~");
    expect(encodeGrpcMessage("50% ü\n")).toBe("50%25 %C3%BC%0A");
  });
});
