// gRPC server reflection (grpc.reflection.v1 and v1alpha), so that grpcurl,
// Postman and `buf curl` without --schema can list and call the services.
// It answers from the descriptors compiled into gen/: the services the
// router serves, and every file they are declared in and depend on.
//
// Open without a token, like grpc.health.v1.Health: it shows only the
// schema, which the OpenAPI documents and proto/ publish already.
import {
  create,
  fromBinary,
  toBinary,
  type DescExtension,
  type DescFile,
  type DescService,
  type Registry,
  createRegistry,
} from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, type ConnectRouter } from "@connectrpc/connect";
import {
  ServerReflection,
  ServerReflectionRequestSchema,
  ServerReflectionResponseSchema,
  type ServerReflectionRequest,
  type ServerReflectionResponse,
} from "../../gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflection as ServerReflectionAlpha,
  ServerReflectionRequestSchema as AlphaRequestSchema,
  ServerReflectionResponseSchema as AlphaResponseSchema,
} from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";

/** The reflection services, for the auth interceptor (they are open) and the router. */
export const REFLECTION_SERVICES: readonly DescService[] = [ServerReflection, ServerReflectionAlpha];

/** What reflection answers from: the services served, and the files that declare them with their dependencies. */
export class ReflectionIndex {
  readonly services: readonly string[];
  private readonly registry: Registry;
  private readonly files = new Map<string, DescFile>();

  constructor(services: readonly DescService[]) {
    this.services = [...new Set(services.map((s) => s.typeName))].sort();
    const add = (file: DescFile): void => {
      if (this.files.has(fileName(file))) return;
      this.files.set(fileName(file), file);
      file.dependencies.forEach(add);
    };
    for (const s of services) add(s.file);
    this.registry = createRegistry(...this.files.values());
  }

  /** The file of that name (e.g. "grpc/health/v1/health.proto"). */
  file(name: string): DescFile | undefined {
    return this.files.get(name);
  }

  /** The file that declares a message, enum, service, method, field, enum value or extension of that full name. */
  fileContaining(symbol: string): DescFile | undefined {
    const desc = this.registry.get(symbol);
    if (desc) return desc.file;
    // A method, field or enum value: its parent's file.
    const dot = symbol.lastIndexOf(".");
    if (dot < 0) return undefined;
    const parent = this.registry.get(symbol.slice(0, dot));
    if (parent?.kind === "service" && parent.methods.some((m) => m.name === symbol.slice(dot + 1))) return parent.file;
    if (parent?.kind === "message" && parent.fields.some((f) => f.name === symbol.slice(dot + 1))) return parent.file;
    if (parent?.kind === "enum" && parent.values.some((v) => v.name === symbol.slice(dot + 1))) return parent.file;
    return undefined;
  }

  extension(extendee: string, number: number): DescExtension | undefined {
    const message = this.registry.getMessage(extendee);
    return message ? this.registry.getExtensionFor(message, number) : undefined;
  }

  extensionNumbers(extendee: string): number[] | undefined {
    if (!this.registry.getMessage(extendee)) return undefined;
    const numbers: number[] = [];
    for (const desc of this.registry) {
      if (desc.kind === "extension" && desc.extendee.typeName === extendee) numbers.push(desc.number);
    }
    return numbers.sort((a, b) => a - b);
  }

  /**
   * The file (always: the caller asked for it) and the files it depends on,
   * transitively, that this stream has not sent yet, as grpc-go does; `sent`
   * is updated.
   */
  closure(file: DescFile, sent: Set<string>): Uint8Array[] {
    const out: Uint8Array[] = [];
    const visit = (f: DescFile, asked: boolean): void => {
      if (sent.has(fileName(f)) && !asked) return;
      sent.add(fileName(f));
      out.push(toBinary(FileDescriptorProtoSchema, f.proto));
      for (const dep of f.dependencies) visit(dep, false);
    };
    visit(file, true);
    return out;
  }
}

function fileName(file: DescFile): string {
  return file.proto.name;
}

/** One answer of the stream; `sent` holds the files this stream already sent. */
export function answer(
  index: ReflectionIndex,
  req: ServerReflectionRequest,
  sent: Set<string>,
): ServerReflectionResponse {
  const base = { validHost: req.host, originalRequest: req };
  const notFound = (message: string): ServerReflectionResponse =>
    create(ServerReflectionResponseSchema, {
      ...base,
      messageResponse: { case: "errorResponse", value: { errorCode: Code.NotFound, errorMessage: message } },
    });
  const files = (file: DescFile): ServerReflectionResponse =>
    create(ServerReflectionResponseSchema, {
      ...base,
      messageResponse: {
        case: "fileDescriptorResponse",
        value: { fileDescriptorProto: index.closure(file, sent) },
      },
    });
  const request = req.messageRequest;
  switch (request.case) {
    case "listServices":
      return create(ServerReflectionResponseSchema, {
        ...base,
        messageResponse: {
          case: "listServicesResponse",
          value: { service: index.services.map((name) => ({ name })) },
        },
      });
    case "fileByFilename": {
      const file = index.file(request.value);
      return file ? files(file) : notFound(`file ${request.value} not found`);
    }
    case "fileContainingSymbol": {
      const file = index.fileContaining(request.value);
      return file ? files(file) : notFound(`symbol ${request.value} not found`);
    }
    case "fileContainingExtension": {
      const ext = index.extension(request.value.containingType, request.value.extensionNumber);
      return ext
        ? files(ext.file)
        : notFound(`extension ${request.value.extensionNumber} of ${request.value.containingType} not found`);
    }
    case "allExtensionNumbersOfType": {
      const numbers = index.extensionNumbers(request.value);
      if (!numbers) return notFound(`type ${request.value} not found`);
      return create(ServerReflectionResponseSchema, {
        ...base,
        messageResponse: {
          case: "allExtensionNumbersResponse",
          value: { baseTypeName: request.value, extensionNumber: numbers },
        },
      });
    }
    default:
      return create(ServerReflectionResponseSchema, {
        ...base,
        messageResponse: {
          case: "errorResponse",
          value: { errorCode: Code.InvalidArgument, errorMessage: "empty reflection request" },
        },
      });
  }
}

/**
 * Registers grpc.reflection.v1 and v1alpha on the router. Call it after
 * every other service: it lists the services registered so far (and itself).
 */
export function reflectionRoutes(router: ConnectRouter): void {
  const served = [...new Set(router.handlers.map((h) => h.service)), ...REFLECTION_SERVICES];
  const index = new ReflectionIndex(served);
  router.service(ServerReflection, {
    async *serverReflectionInfo(requests) {
      const sent = new Set<string>();
      for await (const req of requests) yield answer(index, req, sent);
    },
  });
  // v1alpha has the same messages, field for field, in another package.
  router.service(ServerReflectionAlpha, {
    async *serverReflectionInfo(requests) {
      const sent = new Set<string>();
      for await (const req of requests) {
        const v1 = fromBinary(ServerReflectionRequestSchema, toBinary(AlphaRequestSchema, req));
        yield fromBinary(AlphaResponseSchema, toBinary(ServerReflectionResponseSchema, answer(index, v1, sent)));
      }
    },
  });
}
