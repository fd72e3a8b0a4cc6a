/** Node's options for the skiff server, as `npm start` runs it (see bin/server-flags.js). */
export const SERVER_NODE_FLAGS: readonly string[];
