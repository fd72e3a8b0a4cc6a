// Relays the sandbox's channel to a Custom app, which listens on
// 127.0.0.1:$PORT inside its own network namespace, where there is no
// python3 for relay.py, and as relay.py does:
//
//   node relay.mjs FD PORT
//
// accepts on the listening Unix socket FD (handed over by the runner) and
// pipes each connection to 127.0.0.1:PORT, waiting (up to CONNECT_WAIT_MS)
// for the app to listen. Bytes flow as they come, in both directions, with
// back-pressure (a side is not read while the other's buffer is full); an end
// of input on one side is passed on as an end of output (shutdown) on the
// other, and the connection closes once both directions have ended, or at
// the first error. It ignores SIGTERM, which is the app's to act on
// (draining); it ends with the sandbox.
import net from "node:net";

const CONNECT_WAIT_MS = 5000;
const CONNECT_RETRY_MS = 3;

const fd = Number(process.argv[2]);
const port = Number(process.argv[3]);
process.on("SIGTERM", () => {});

function relay(client, app) {
  app.on("error", () => client.destroy());
  client.on("error", () => app.destroy());
  app.on("close", (failed) => failed && client.destroy());
  client.on("close", (failed) => failed && app.destroy());
  client.pipe(app);
  app.pipe(client);
}

net
  .createServer({ allowHalfOpen: true, pauseOnConnect: true }, (client) => {
    const deadline = Date.now() + CONNECT_WAIT_MS;
    client.on("error", () => client.destroy());
    const dial = () => {
      if (client.destroyed) return;
      const app = net.connect({ host: "127.0.0.1", port, noDelay: true, allowHalfOpen: true });
      const notYet = () => {
        if (Date.now() < deadline) setTimeout(dial, CONNECT_RETRY_MS);
        else client.destroy();
      };
      app.once("error", notYet);
      app.once("connect", () => {
        app.off("error", notYet);
        relay(client, app);
      });
    };
    dial();
  })
  .listen({ fd });
