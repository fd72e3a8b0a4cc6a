// Authentication of every RPC by one Connect interceptor, so Connect, gRPC,
// gRPC-Web and REST (the transcoder calls the same handlers with the same
// interceptors) are checked alike. Only grpc.health.v1.Health (for probes)
// and server reflection (the schema, public anyway) stay open.
//
// 401 `unauthenticated`: no token, or a token refused for any reason (the
// message does not say which). 403 `permission_denied`: a service account's
// token used on another project, judged by the request message's project_id.
//
// The token alone is judged before a call's body is read as well (`admit`,
// which the server and the REST transcoder ask first): a caller without a
// valid token never has a body buffered or parsed for it (DeployApp's may be
// SKIFF_MAX_BUNDLE_BYTES), on any protocol.
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextKey, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import type { NatsConnection } from "nats";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ServerReflectionAlpha } from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { AccountDirectory } from "./accounts.js";
import { AdminTokens } from "./admin-tokens.js";
import { Authenticator, type Principal, type ServiceAccountPrincipal } from "./authenticator.js";
import type { Logger } from "../config/index.js";
import type { Admit, AdmitVerdict } from "../server/index.js";
import { buckets } from "../nats/index.js";
import { Keyring } from "./keyring.js";

export type { Principal, ServiceAccountPrincipal } from "./authenticator.js";

const kPrincipal = createContextKey<Principal | undefined>(undefined, {
  description: "skiff authenticated principal",
});

/** Services callable without a token: health, and reflection (it shows only the schema, public in OpenAPI too). */
const OPEN_SERVICES = new Set([Health.typeName, ServerReflection.typeName, ServerReflectionAlpha.typeName]);

const CHALLENGE = { "www-authenticate": 'Bearer realm="skiff"' };

/** The principal the interceptor put in the context; a handler reached without one refuses the call. */
export function principalOf(ctx: HandlerContext): Principal {
  const p = ctx.values.get(kPrincipal);
  if (!p) throw new ConnectError("missing bearer token", Code.Unauthenticated);
  return p;
}

/** Who did it, for audit lines and `created_by`: "admin" or the service account id. */
export function actorOf(p: Principal): string {
  return p.kind === "admin" ? "admin" : p.serviceAccountId;
}

/** The last Authorization header read and its token: a caller sends the same one call after call. */
let lastHeader: string | null = null;
let lastToken: string | undefined;

function bearerToken(header: string | null): string | undefined {
  if (header === lastHeader) return lastToken;
  const m = header === null ? null : /^Bearer +(\S+) *$/i.exec(header);
  lastHeader = header;
  lastToken = m ? m[1] : undefined;
  return lastToken;
}

/**
 * The localName of a method's `project_id` input field, if it has one (computed once per method): the project
 * the call acts in. CreateProject's names the project to make, which no service account may (its handler lets
 * only the admin token, and says so).
 */
const projectFields = new WeakMap<DescMethod, string | null>();
function projectField(method: DescMethod): string | null {
  let f = projectFields.get(method);
  if (f === undefined) {
    f =
      method === ManagementService.method.createProject
        ? null
        : (method.input.fields.find((x) => x.name === "project_id")?.localName ?? null);
    projectFields.set(method, f);
  }
  return f;
}

function checkScope(p: ServiceAccountPrincipal, field: string, message: unknown): void {
  const projectId = (message as Record<string, unknown>)[field];
  if (projectId !== p.projectId)
    throw new ConnectError("this token does not grant access to that project", Code.PermissionDenied);
}

async function* scoped<T>(messages: AsyncIterable<T>, p: ServiceAccountPrincipal, field: string): AsyncIterable<T> {
  for await (const m of messages) {
    checkScope(p, field, m);
    yield m;
  }
}

/**
 * How often the token of an open stream (WatchRuns, TailAppLogs) is checked
 * again: a stream ends with `unauthenticated` at most this long after its
 * token expired or its service account (or admin token) was deleted. A check
 * costs a few map lookups.
 */
const STREAM_RECHECK_MS = 250;

/**
 * The messages of a streaming answer while its token stays valid; the stream
 * ends with `unauthenticated` once it does not. A check that cannot be
 * answered (NATS unreachable) keeps the stream going, as the token's fate is
 * unknown.
 */
async function* whileValid<T>(
  messages: AsyncIterable<T>,
  valid: () => Promise<boolean>,
  everyMs: number,
): AsyncGenerator<T> {
  const it = messages[Symbol.asyncIterator]();
  let timer: NodeJS.Timeout | undefined;
  const revoked = new Promise<never>((_, reject) => {
    const check = async () => {
      const ok = await valid().catch(() => true);
      if (ok) timer = setTimeout(check, everyMs);
      else reject(new ConnectError("the token expired or was revoked", Code.Unauthenticated, CHALLENGE));
    };
    timer = setTimeout(check, everyMs);
  });
  revoked.catch(() => undefined);
  try {
    for (;;) {
      const next = await Promise.race([it.next(), revoked]);
      if (next.done) return;
      yield next.value;
    }
  } finally {
    clearTimeout(timer);
    // Not awaited: a handler waiting for its next message ends through its
    // context's signal, which Connect aborts when the call ends.
    void it.return?.();
  }
}

type TokenChecks = Pick<Authenticator, "authenticate" | "cached">;

const missingToken = () =>
  new ConnectError("missing bearer token: send Authorization: Bearer <token>", Code.Unauthenticated, CHALLENGE);
const invalidToken = () => new ConnectError("invalid bearer token", Code.Unauthenticated, CHALLENGE);

/** The principal of a bearer token; throws the call's refusal when there is none. */
async function principalOfToken(auth: TokenChecks, logger: Logger, token: string): Promise<Principal> {
  let principal: Principal | undefined;
  try {
    principal = await auth.authenticate(token);
  } catch (err) {
    logger.warn({ err }, "cannot check a token");
    throw new ConnectError("cannot check the token right now; try again", Code.Unavailable);
  }
  if (!principal) throw invalidToken();
  return principal;
}

/**
 * A call of `service` judged by its Authorization header alone, before its
 * body is read (see the server's Admit): the token's principal (the
 * interceptor then judges the call in full), undefined for an open service,
 * or the refusal to answer at once. A token seen before is judged without
 * an await.
 */
function admitter(auth: TokenChecks, logger: Logger): Admit {
  return (service, authorization) => {
    if (OPEN_SERVICES.has(service)) return undefined;
    const token = bearerToken(authorization ?? null);
    if (token === undefined) return missingToken();
    return (
      auth.cached(token) ??
      principalOfToken(auth, logger, token).catch((err: unknown): AdmitVerdict => ConnectError.from(err))
    );
  };
}

function authInterceptor(auth: TokenChecks, logger: Logger, recheckMs = STREAM_RECHECK_MS): Interceptor {
  return (next) => async (req) => {
    if (OPEN_SERVICES.has(req.service.typeName)) return next(req);
    const token = bearerToken(req.header.get("authorization"));
    if (token === undefined) throw missingToken();
    // A token seen before is known without an await; any other is checked.
    const principal = auth.cached(token) ?? (await principalOfToken(auth, logger, token));
    req.contextValues.set(kPrincipal, principal);
    const field = principal.kind === "service_account" ? projectField(req.method) : null;
    let res;
    if (principal.kind === "admin" || field === null) res = await next(req);
    else if (!req.stream) {
      checkScope(principal, field, req.message);
      res = await next(req);
    } else res = await next({ ...req, message: scoped(req.message, principal, field) });
    if (!res.stream) return res;
    const valid = async () => (await auth.authenticate(token)) !== undefined;
    return { ...res, message: whileValid(res.message, valid, recheckMs) };
  };
}

/** Everything a process needs to check tokens, fed by KV watches. */
export interface Auth {
  keyring: Keyring;
  accounts: AccountDirectory;
  admins: AdminTokens;
  authenticator: Authenticator;
  interceptor: Interceptor;
  /** Judges a call by its token before its body is read (see Admit). */
  admit: Admit;
  close(): void;
}

export async function startAuth(nc: NatsConnection, logger: Logger): Promise<Auth> {
  const js = nc.jetstream();
  const keysKv = await js.views.kv(buckets.keys.name, { bindOnly: true });
  const accountsKv = await js.views.kv(buckets.serviceAccounts.name, { bindOnly: true });
  const keyring = new Keyring(keysKv, logger);
  const accounts = new AccountDirectory(accountsKv, logger);
  const admins = new AdminTokens(keysKv, logger);
  await Promise.all([keyring.start(), accounts.start(), admins.start()]);
  const authenticator = new Authenticator({
    publicKey: keyring.publicKey,
    findAccount: (project, id) => accounts.find(project, id),
    isAdmin: (token) => admins.accepts(token),
    logger,
  });
  return {
    keyring,
    accounts,
    admins,
    authenticator,
    interceptor: authInterceptor(authenticator, logger),
    admit: admitter(authenticator, logger),
    close() {
      keyring.close();
      accounts.close();
      admins.close();
    },
  };
}
