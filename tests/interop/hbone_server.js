// An independent HBONE server (Node.js built-in http2 + tls, no packages) for interop tests.
//
// usage: node hbone_server.js HOST PORT CERT_DIR AUTHORITY
// Serves mTLS (TLS 1.3 only, ALPN h2, client certificate required and verified against
// root-cert.pem). A CONNECT whose :authority is AUTHORITY gets 200 and the test echo server's
// mode E (read "E" + bytes to END_STREAM, answer sha256(bytes) + bytes); any other request gets
// 400. Prints {"listening": PORT} once bound, then one JSON line per request with the method,
// authority, forwarded and baggage headers and the client certificate's URI SANs, and one
// {"goaway": code, "debug": text} line per GOAWAY a client sends.
"use strict";
const crypto = require("node:crypto");
const fs = require("node:fs");
const http2 = require("node:http2");
const path = require("node:path");

const [host, port, certDir, authority] = process.argv.slice(2);
const read = (name) => fs.readFileSync(path.join(certDir, name));

const server = http2.createSecureServer({
  cert: read("cert-chain.pem"),
  key: read("key.pem"),
  ca: read("root-cert.pem"),
  requestCert: true,
  rejectUnauthorized: true,
  minVersion: "TLSv1.3",
  ALPNProtocols: ["h2"],
  allowHTTP1: false,
});

server.on("stream", (stream, headers) => {
  const cert = stream.session.socket.getPeerCertificate();
  const sans = (cert.subjectaltname || "").split(", ");
  const record = {
    method: headers[":method"],
    authority: headers[":authority"],
    forwarded: headers.forwarded || null,
    baggage: headers.baggage || null,
    san: sans.filter((x) => x.startsWith("URI:")).map((x) => x.slice(4)),
  };
  process.stdout.write(JSON.stringify(record) + "\n");
  if (headers[":method"] !== "CONNECT" || headers[":authority"] !== authority) {
    stream.respond({ ":status": 400 }, { endStream: true });
    return;
  }
  stream.respond({ ":status": 200 });
  const chunks = [];
  stream.on("data", (chunk) => chunks.push(chunk));
  stream.on("end", () => {
    const data = Buffer.concat(chunks);
    if (data.length === 0 || data[0] !== 0x45) {  // "E"
      stream.close(http2.constants.NGHTTP2_PROTOCOL_ERROR);
      return;
    }
    const body = data.subarray(1);
    const digest = crypto.createHash("sha256").update(body).digest();
    stream.end(Buffer.concat([digest, body]));
  });
  stream.on("error", () => {});
});
server.on("session", (session) => {
  session.on("goaway", (code, lastStreamId, data) => {
    const debug = data ? data.toString() : "";
    process.stdout.write(JSON.stringify({ goaway: code, debug }) + "\n");
  });
  session.on("error", () => {});
});
server.on("sessionError", () => {});
server.listen(Number(port), host, () => {
  process.stdout.write(JSON.stringify({ listening: Number(port) }) + "\n");
});
process.on("SIGTERM", () => process.exit(0));
