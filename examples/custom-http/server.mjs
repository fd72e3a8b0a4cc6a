// A Custom-runtime app: any HTTP server listening on $PORT. The platform
// forwards the path after the app name, the query, headers and body, and
// passes the response back untouched.
import http from "node:http";

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const url = new URL(req.url ?? "/", "http://app");
    if (url.pathname === "/health") return send(res, 200, { status: "ok" });
    if (url.pathname === "/hello")
      return send(res, 200, { message: `${process.env.GREETING}, ${url.searchParams.get("name") ?? "world"}!` });
    if (url.pathname.startsWith("/echo")) {
      return send(
        res,
        200,
        {
          method: req.method,
          path: url.pathname,
          query: url.search.slice(1),
          headers: req.headers,
          body: Buffer.concat(chunks).toString("utf8"),
        },
        { "x-app": "custom-http" },
      );
    }
    send(res, 404, { error: `no route ${url.pathname}` });
  });
});

function send(res, status, body, headers = {}) {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

// Finish the requests in flight, then exit.
process.on("SIGTERM", () => server.close(() => process.exit(0)));
server.listen(Number(process.env.PORT), "127.0.0.1", () => console.log(`listening on ${process.env.PORT}`));
