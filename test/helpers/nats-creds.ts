// Decentralized NATS auth (operator, accounts, users as signed JWTs) made
// without nsc: nkeys from nats.js and JWTs signed here as nats-server checks
// them (header {"typ":"JWT","alg":"ed25519-nkey"}, Ed25519 over
// "header.payload", base64url). Gives a server config that trusts the
// operator and a .creds file for one user of a JetStream-enabled account.
import { randomBytes } from "node:crypto";
import { nkeys } from "nats";

type KeyPair = ReturnType<typeof nkeys.createOperator>;

const b64 = (data: Uint8Array | string) => Buffer.from(data).toString("base64url");

function jwt(issuer: KeyPair, subject: string, name: string, nats: object): string {
  const header = b64(JSON.stringify({ typ: "JWT", alg: "ed25519-nkey" }));
  const claims = {
    jti: b64(randomBytes(16)),
    iat: Math.floor(Date.now() / 1000),
    iss: issuer.getPublicKey(),
    name,
    sub: subject,
    nats,
  };
  const signed = `${header}.${b64(JSON.stringify(claims))}`;
  return `${signed}.${b64(issuer.sign(new TextEncoder().encode(signed)))}`;
}

const UNLIMITED = { subs: -1, data: -1, payload: -1, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 };

export interface OperatorAuth {
  /** Server config lines: operator, system account, memory resolver with both accounts preloaded. */
  serverConfig: string;
  /** A .creds file of a user of the JetStream-enabled account, as nsc writes one. */
  creds: string;
}

export function makeOperatorAuth(): OperatorAuth {
  const operator = nkeys.createOperator();
  const system = nkeys.createAccount();
  const account = nkeys.createAccount();
  const user = nkeys.createUser();
  const operatorJwt = jwt(operator, operator.getPublicKey(), "skiff-test", { type: "operator", version: 2 });
  const systemJwt = jwt(operator, system.getPublicKey(), "SYS", { limits: UNLIMITED, type: "account", version: 2 });
  const accountJwt = jwt(operator, account.getPublicKey(), "skiff", {
    limits: { ...UNLIMITED, mem_storage: -1, disk_storage: -1, streams: -1, consumer: -1 },
    type: "account",
    version: 2,
  });
  const userJwt = jwt(account, user.getPublicKey(), "skiff", {
    pub: {},
    sub: {},
    subs: -1,
    data: -1,
    payload: -1,
    type: "user",
    version: 2,
  });
  return {
    serverConfig: [
      `operator: ${operatorJwt}`,
      `system_account: ${system.getPublicKey()}`,
      "resolver: MEMORY",
      "resolver_preload: {",
      `  ${system.getPublicKey()}: ${systemJwt}`,
      `  ${account.getPublicKey()}: ${accountJwt}`,
      "}",
      "",
    ].join("\n"),
    creds: [
      "-----BEGIN NATS USER JWT-----",
      userJwt,
      "------END NATS USER JWT------",
      "",
      "************************* IMPORTANT *************************",
      "NKEY Seed printed below can be used to sign and prove identity.",
      "NKEYs are sensitive and should be treated as secrets.",
      "",
      "-----BEGIN USER NKEY SEED-----",
      new TextDecoder().decode(user.getSeed()),
      "------END USER NKEY SEED------",
      "",
    ].join("\n"),
  };
}
