// Relays the sandbox's channel to a Custom app, which listens on
// 127.0.0.1:$PORT inside its own network namespace:
//
//   node relay.mjs FD PORT
//
// accepts on the listening Unix socket FD (handed over by the runner) and
// pipes each connection to 127.0.0.1:PORT. It ignores SIGTERM, which is the
// app's to act on (draining); it ends with the sandbox.
import net from "node:net";

const fd = Number(process.argv[2]);
const port = Number(process.argv[3]);
process.on("SIGTERM", () => {});

net
  .createServer((client) => {
    const app = net.connect({ host: "127.0.0.1", port, noDelay: true });
    client.pipe(app);
    app.pipe(client);
    app.on("error", () => client.destroy());
    client.on("error", () => app.destroy());
    client.on("close", () => app.destroy());
    app.on("close", () => client.end());
  })
  .listen({ fd });
