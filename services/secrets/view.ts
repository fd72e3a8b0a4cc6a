// The project secrets a runner gives its replicas, followed by a watch of KV
// `skiff-project-secrets`: held sealed in memory, opened only when a replica
// starts. Each change is told to the listeners with its project, so the
// runner can restart that project's replicas with the new values.
import type { NatsConnection } from "nats";
import type { Logger } from "../config/index.js";
import { buckets, followKv, type KvFollower } from "../nats/index.js";
import type { SecretBox } from "../webhooks/index.js";
import { decodeSecret, secretKey } from "./store.js";

export class ProjectSecretsView {
  /** Sealed values by project, then by name. */
  private readonly sealed = new Map<string, Map<string, string>>();
  private readonly listeners = new Set<(projectId: string) => void>();

  private constructor(
    private readonly box: SecretBox,
    private readonly logger: Logger,
    private follower?: KvFollower,
  ) {}

  /** Follows the bucket; resolves once the current secrets are loaded. */
  static async start(nc: NatsConnection, box: SecretBox, logger: Logger): Promise<ProjectSecretsView> {
    const view = new ProjectSecretsView(box, logger);
    const kv = await nc.jetstream().views.kv(buckets.projectSecrets.name, { bindOnly: true });
    view.follower = followKv({
      kv,
      name: buckets.projectSecrets.name,
      logger,
      shouldStop: () => nc.isClosed(),
      onEntry: (entry) => {
        const dot = entry.key.indexOf(".");
        if (dot <= 0) return;
        const projectId = entry.key.slice(0, dot);
        const name = entry.key.slice(dot + 1);
        const record = decodeSecret(entry);
        const project = view.sealed.get(projectId) ?? new Map<string, string>();
        const before = project.get(name);
        if (record) project.set(name, record.sealed);
        else project.delete(name);
        if (project.size > 0) view.sealed.set(projectId, project);
        else view.sealed.delete(projectId);
        if (before !== record?.sealed) for (const listener of view.listeners) listener(projectId);
      },
    });
    await view.follower.ready;
    return view;
  }

  /** Called with the project of each secret set or deleted (also for those the watch replays at start). */
  onChange(listener: (projectId: string) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * The project's secrets as environment variables. A value that does not
   * open (another platform key) is left out, and the log names the secret,
   * never a value.
   */
  env(projectId: string): Record<string, string> {
    const out: Record<string, string> = {};
    for (const [name, sealed] of this.sealed.get(projectId) ?? []) {
      try {
        out[name] = this.box.unseal(sealed, secretKey(projectId, name));
      } catch (err) {
        this.logger.error(
          { project: projectId, secret: name, err: (err as Error).message },
          `secret ${name} of project ${projectId} does not open; its replicas start without it`,
        );
      }
    }
    return out;
  }

  stop(): void {
    this.follower?.stop();
  }
}
