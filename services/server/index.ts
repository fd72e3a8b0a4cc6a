// The one port: HTTP/1.1 and h2c for Connect, gRPC, gRPC-Web and REST (the
// HTTP/JSON transcoder in rest/), health probes, OpenAPI documents, the
// dashboard's static files, and which headers cross between callers and apps.
export { HealthState, healthRoutes } from "./health.js";
export { appRequestHeaders, callerHeaders, isForwardedToApp, isPassedToCaller } from "./headers.js";
export { codeHttpStatus, errorBody, malformedJson } from "./rest/errors.js";
export { httpExchange, LightSignal, setHttpStatus, streamHttpBody } from "./rest/http-exchange.js";
export type { CallSignal, HttpExchange, StreamedBody, StreamedRequestBody } from "./rest/http-exchange.js";
export { ClientGoneError, readWhole } from "./rest/body.js";
export { openapiDocument, openapiDocuments } from "./rest/openapi.js";
export type { ApiDocument } from "./rest/openapi.js";
export { AddressCounts } from "./connections.js";
export { startServer } from "./server.js";
export type { Admit, AdmitVerdict } from "./admit.js";
export type { Cors } from "./rest/transcoder.js";
export type { UpgradeHandler } from "./server.js";
export { CLOSE, FrameReader, closeFrame } from "./websocket-frames.js";
export { WebSocketRelay } from "./websocket-relay.js";
export type { RelayEnd } from "./websocket-relay.js";
export { createStaticFiles } from "./static-files.js";
