// Stored records to the messages of management.proto.
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceAccountRecord } from "../shared/auth-accounts.js";
import type { ProjectRecord } from "./project-store.js";

export function projectMessage(r: ProjectRecord) {
  return { projectId: r.project_id, name: r.name, createdAt: timestampFromDate(new Date(r.created_at)) };
}

export function serviceAccountMessage(r: ServiceAccountRecord) {
  return {
    serviceAccountId: r.service_account_id,
    name: r.name,
    createdAt: timestampFromDate(new Date(r.created_at)),
    expiresAt: timestampFromDate(new Date(r.expires_at)),
  };
}
