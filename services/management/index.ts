// The management role: ManagementService (projects, service accounts,
// apps, runs, webhook deliveries) and the bootstrap of a fresh install.
export { adminTokenFile, devTokenFile } from "./bootstrap.js";
export { deployExamples } from "./examples.js";
export { startManagementRole } from "./role.js";
