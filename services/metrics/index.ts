// Metrics: one Prometheus registry per process and what the roles record into it.
export { Metrics, METRICS_CONTENT_TYPE } from "./metrics.js";
export type { StoreFigure, StoreSource } from "./metrics.js";
