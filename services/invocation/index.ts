// The invocation role: InvocationService (sync and async runs).
export { startInvocationRole } from "./role.js";
