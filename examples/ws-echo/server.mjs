// A Custom-runtime app that speaks WebSocket itself, with Node's standard
// library only (no npm packages): skiff passes the caller's handshake on to
// it and relays the bytes both ways once it answered 101.
//
//   GET /health                  200, for skiff's healthcheck
//   GET /echo  (Upgrade)         echoes every text and binary message; answers pings;
//                                chooses the subprotocol "echo" when the caller offers it
//     text "headers"             answers with the handshake it got: {"url", "headers"}
//     text "close <code> <why>"  closes the connection with that code and reason
//     text "crash"               exits the process at once (its replica dies)
//
// A real app would use a WebSocket library (ws for Node, websockets for
// Python); the frame handling below is the part of RFC 6455 an echo needs.
import { createHash } from "node:crypto";
import http from "node:http";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const MAX_MESSAGE = 16 * 1024 * 1024;

const server = http.createServer((req, res) => {
  if (req.url === "/health") {
    res.writeHead(200, { "content-type": "application/json" });
    return res.end('{"status":"ok"}');
  }
  res.writeHead(404, { "content-type": "application/json" });
  res.end(JSON.stringify({ error: `no route ${req.url}; open a WebSocket on /echo` }));
});

server.on("upgrade", (req, socket) => {
  const key = req.headers["sec-websocket-key"];
  if (!req.url.startsWith("/echo") || req.headers.upgrade?.toLowerCase() !== "websocket" || !key) {
    socket.end(
      "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 21\r\nconnection: close\r\n\r\nno WebSocket endpoint",
    );
    return;
  }
  const accept = createHash("sha1")
    .update(key + GUID)
    .digest("base64");
  const offered = (req.headers["sec-websocket-protocol"] ?? "").split(",").map((p) => p.trim());
  const lines = [
    "HTTP/1.1 101 Switching Protocols",
    "Upgrade: websocket",
    "Connection: Upgrade",
    `Sec-WebSocket-Accept: ${accept}`,
  ];
  if (offered.includes("echo")) lines.push("Sec-WebSocket-Protocol: echo");
  socket.write(lines.join("\r\n") + "\r\n\r\n");
  socket.setNoDelay(true);
  serve(socket, { url: req.url, headers: req.headers });
});

const open = new Set();

/** One connection: reads frames, answers them. */
function serve(socket, handshake) {
  open.add(socket);
  socket.on("close", () => open.delete(socket));
  let buffered = Buffer.alloc(0);
  let message = [];
  let messageType = 0;
  let closing = false;
  socket.on("error", () => socket.destroy());
  socket.on("data", (chunk) => {
    buffered = buffered.length ? Buffer.concat([buffered, chunk]) : chunk;
    for (;;) {
      const frame = readFrame(buffered);
      if (!frame) return;
      buffered = buffered.subarray(frame.size);
      if (frame.opcode === 0x8) {
        // Echo the caller's close (code and reason), then end the connection.
        if (!closing) socket.write(encode(0x8, frame.payload));
        closing = true;
        return socket.end();
      }
      if (frame.opcode === 0x9) socket.write(encode(0xa, frame.payload));
      if (frame.opcode >= 0x8) continue;
      if (frame.opcode !== 0) messageType = frame.opcode;
      message.push(frame.payload);
      if (!frame.fin) continue;
      const data = Buffer.concat(message);
      message = [];
      if (data.length > MAX_MESSAGE) return close(1009, "message too big");
      onMessage(messageType, data);
    }
  });

  function onMessage(type, data) {
    const text = type === 0x1 ? data.toString("utf8") : undefined;
    if (text === "headers") return socket.write(encode(0x1, Buffer.from(JSON.stringify(handshake))));
    if (text === "crash") process.exit(1);
    const close = text && /^close (\d{4})(?: (.*))?$/.exec(text);
    if (close) return closeWith(Number(close[1]), close[2] ?? "");
    socket.write(encode(type, data));
  }

  function closeWith(code, reason) {
    const payload = Buffer.alloc(2 + Buffer.byteLength(reason));
    payload.writeUInt16BE(code, 0);
    payload.write(reason, 2);
    closing = true;
    socket.write(encode(0x8, payload));
    // The caller answers with its own close frame, then the connection ends.
    setTimeout(() => socket.destroy(), 1000).unref();
  }
}

/** One frame from the front of `buf` (client frames are masked), or undefined until it is whole. */
function readFrame(buf) {
  if (buf.length < 2) return undefined;
  let length = buf[1] & 0x7f;
  let at = 2;
  if (length === 126) {
    if (buf.length < 4) return undefined;
    length = buf.readUInt16BE(2);
    at = 4;
  } else if (length === 127) {
    if (buf.length < 10) return undefined;
    length = Number(buf.readBigUInt64BE(2));
    at = 10;
  }
  const masked = (buf[1] & 0x80) !== 0;
  const mask = masked ? buf.subarray(at, at + 4) : undefined;
  if (masked) at += 4;
  if (buf.length < at + length) return undefined;
  const payload = Buffer.from(buf.subarray(at, at + length));
  if (mask) for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
  return { fin: (buf[0] & 0x80) !== 0, opcode: buf[0] & 0x0f, payload, size: at + length };
}

/** A server frame (unmasked), whole. */
function encode(opcode, payload) {
  const n = payload.length;
  const head = n < 126 ? Buffer.from([0x80 | opcode, n]) : n < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
  if (n >= 126) head[0] = 0x80 | opcode;
  if (n >= 126 && n < 65536) {
    head[1] = 126;
    head.writeUInt16BE(n, 2);
  } else if (n >= 65536) {
    head[1] = 127;
    head.writeBigUInt64BE(BigInt(n), 2);
  }
  return Buffer.concat([head, payload]);
}

// On SIGTERM (a redeploy, a scale-down): no new connections; open ones are closed with 1001 "going away".
process.on("SIGTERM", () => {
  for (const socket of open) {
    socket.write(encode(0x8, Buffer.from([0x03, 0xe9, ...Buffer.from("going away")])));
    socket.end();
  }
  server.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000).unref();
});
server.listen(Number(process.env.PORT), "127.0.0.1", () => console.log(`listening on ${process.env.PORT}`));
