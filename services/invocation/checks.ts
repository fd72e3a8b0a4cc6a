// What is checked before a run is accepted, so that every refusal comes
// before any 202: the app and (Cortex) function exist, a Cortex body is a
// JSON object, the webhook endpoint is usable. Nothing here leaves the
// process but the DNS lookup of a webhook host.
import { Code, ConnectError } from "@connectrpc/connect";
import type { AppRecord, AppRegistry } from "../apps/index.js";
import { malformedJson } from "../server/index.js";
import { type AddressGuard, InvalidWebhookEndpointError, validateWebhookEndpoint } from "../webhooks/index.js";

const EMPTY_OBJECT = new TextEncoder().encode("{}");
const utf8 = new TextDecoder("utf-8", { fatal: true });

const quoted = (text: string) => JSON.stringify(text.length > 80 ? `${text.slice(0, 80)}...` : text);

export async function findApp(
  registry: Pick<AppRegistry, "lookup">,
  projectId: string,
  appName: string,
): Promise<AppRecord> {
  const app = await registry.lookup(projectId, appName);
  if (!app) throw new ConnectError(`app ${quoted(appName)} not found in project ${projectId}`, Code.NotFound);
  return app;
}

/** A Cortex function name from the path: public (no leading "_") and one the deployment exports. */
export function cortexFunction(app: AppRecord, path: string): string {
  const fn = path.startsWith("/") ? path.slice(1) : path;
  const known = app.functions === undefined || app.functions.includes(fn);
  if (fn === "" || fn.startsWith("_") || !known) {
    // What can be called, so that a path without a function or with a stray "/" says how to mend it.
    const names = (app.functions ?? []).filter((f) => !f.startsWith("_"));
    const listed =
      names.length === 0
        ? ""
        : `; its functions: ${names.slice(0, 20).join(", ")}${names.length > 20 ? `, and ${names.length - 20} more` : ""}`;
    const call = `call one as /v4/${app.project_id}/${app.app_name}/<function>`;
    throw new ConnectError(
      fn === ""
        ? `app ${app.app_name} is a Cortex app: name the function to ${call}${listed}`
        : `app ${app.app_name} has no public function ${quoted(fn)}${listed}`,
      Code.NotFound,
    );
  }
  return fn;
}

/**
 * A Custom app's path. A REST call's path goes on as the caller wrote it
 * (`raw`, percent-encoding included: `echo%2Fdeep` stays one segment); a
 * Connect or gRPC call's `path` field is text, whose segments are encoded.
 */
export function customPath(path: string, raw: string | undefined): string {
  if (raw !== undefined) return `/${raw}`;
  return "/" + path.split("/").map(encodeURIComponent).join("/");
}

const latin1 = (text: string) => Buffer.from(text, "latin1");

/**
 * The X-Webhook-Secret as the caller sent it. HTTP hands header values over
 * as bytes, which Node reads one character per byte; the secret is the text
 * those bytes are in UTF-8, and its UTF-8 bytes are the HMAC key, so that a
 * receiver signing with the secret it knows gets the same signature.
 */
export function webhookSecret(header: string | null): string | undefined {
  if (header === null) return undefined;
  // A character above U+00FF cannot have come from the wire as one byte.
  if (!/^[\u0000-\u00ff]*$/.test(header)) {
    throw new ConnectError("X-Webhook-Secret must be sent as UTF-8 bytes", Code.InvalidArgument);
  }
  let secret: string;
  try {
    secret = utf8.decode(latin1(header));
  } catch {
    throw new ConnectError("X-Webhook-Secret is not valid UTF-8 text", Code.InvalidArgument);
  }
  if (secret === "") throw new ConnectError("X-Webhook-Secret is empty", Code.InvalidArgument);
  return secret;
}

/** A Cortex body: a JSON object, or empty for no arguments. */
export function cortexBody(body: Uint8Array, contentType = ""): Uint8Array {
  if (body.byteLength === 0) return EMPTY_OBJECT;
  let value: unknown;
  try {
    value = JSON.parse(utf8.decode(body));
  } catch (err) {
    throw new ConnectError(malformedJson(err) + sentAs(contentType), Code.InvalidArgument);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new ConnectError(
      "the body must be a JSON object: its fields are the function's arguments",
      Code.InvalidArgument,
    );
  }
  return body;
}

/** For a body that is not JSON: the media type it was sent as, when that is not JSON's (a form, say). */
function sentAs(contentType: string): string {
  const type = contentType.split(";")[0].trim().toLowerCase();
  // Text, or no type: JSON may well come so; a type of its own (a form, say) says why it is not JSON.
  const jsonLike = type === "" || type === "application/json" || type.endsWith("+json") || type === "text/plain";
  if (jsonLike || !/^[\w.+-]+\/[\w.+-]+$/.test(type)) return "";
  return ` (it was sent as ${type}; a Cortex function takes a JSON object of its arguments: send Content-Type: application/json)`;
}

export async function webhookEndpoint(raw: string, guard: AddressGuard): Promise<string | undefined> {
  if (raw === "") return undefined;
  try {
    return (await validateWebhookEndpoint(raw, guard)).href;
  } catch (err) {
    if (err instanceof InvalidWebhookEndpointError) throw new ConnectError(err.message, Code.InvalidArgument);
    throw err;
  }
}
