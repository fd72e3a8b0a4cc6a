// skiff's HTTP/JSON APIs as OpenAPI documents: which services each covers,
// where it is committed (scripts/write-openapi.ts writes it) and where the
// server answers with it (start.ts). The server's OpenAPI builder
// (server/rest/openapi.ts) documents whatever services it is handed.
import { InvocationService } from "../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../gen/skiff/management/v2/management_pb.js";
import type { ApiDocument } from "./server/index.js";

export const SKIFF_APIS: readonly ApiDocument[] = [
  {
    file: "gen/openapi/management.v2.json",
    servedAt: "/v2/openapi.json",
    services: [ManagementService],
    // Spec section 9: the management API description carries version 1.0.0.
    info: {
      title: "skiff management API",
      version: "1.0.0",
      description: "Projects, service accounts and their bearer tokens, app deployments, runs and webhook deliveries.",
    },
  },
  {
    file: "gen/openapi/invocation.v4.json",
    servedAt: "/v4/openapi.json",
    services: [InvocationService],
    info: {
      title: "skiff invocation API",
      version: "1.0.0",
      description:
        "Runs deployed apps over HTTP: synchronously (the function's response) or asynchronously (202 with the run id), " +
        "optionally forwarding the response to a signed webhook.",
    },
  },
];
