// An independent HBONE client (Node.js built-in http2 + tls, no packages) for interop tests.
//
// usage: node hbone_client.js HOST PORT AUTHORITY NBYTES ROOTS_PEM CERT_DIR|- EXPECTED_SAN
// Opens one mTLS (TLS 1.3, ALPN h2, no SNI) HTTP/2 connection, sends CONNECT AUTHORITY
// (RFC 9113 §8.5), streams "E" + NBYTES random bytes, half-closes, and reads the echo
// (sha256(bytes) + bytes, the test echo server's mode E). Prints one JSON line:
// {status, san, ok, sent, received, error, goaway} (goaway: {code, debug} when the server sent
// one). Exits 2 when no HTTP response came (TLS or
// connection failure), 1 when one did but a check failed, and 0 only when the peer's
// certificate carries EXPECTED_SAN as a URI SAN and the echo matches. CERT_DIR "-" sends no
// client certificate.
"use strict";
const crypto = require("node:crypto");
const fs = require("node:fs");
const http2 = require("node:http2");
const path = require("node:path");
const tls = require("node:tls");

const [host, port, authority, nbytes, roots, certDir, expectedSan] = process.argv.slice(2);
const result = {
  status: null, san: null, ok: false, sent: Number(nbytes), received: 0, error: null, goaway: null,
};

function finish(code) {
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(code);
}

function read(name) {
  return fs.readFileSync(path.join(certDir, name));
}

const options = {
  host,
  port: Number(port),
  ca: fs.readFileSync(roots),
  ALPNProtocols: ["h2"],
  minVersion: "TLSv1.3",
  // HBONE peers are identified by their SPIFFE URI SAN, checked below, not by host name.
  checkServerIdentity: () => undefined,
};
if (certDir !== "-") {
  options.cert = read("cert-chain.pem");
  options.key = read("key.pem");
}

setTimeout(() => {
  result.error = "timeout";
  finish(3);
}, 30000).unref();

const session = http2.connect(`https://${host}:${port}`, {
  createConnection: () => tls.connect(options),
});
session.on("goaway", (code, lastStreamId, data) => {
  result.goaway = { code, debug: data ? data.toString() : "" };
});
session.on("error", (err) => {
  result.error = String(err.message || err);
  finish(2);
});
session.on("connect", (s, socket) => {
  const cert = socket.getPeerCertificate();
  const sans = (cert.subjectaltname || "").split(", ");
  result.san = sans.filter((x) => x.startsWith("URI:")).map((x) => x.slice(4));
});

const payload = crypto.randomBytes(Number(nbytes));
const req = session.request({ ":method": "CONNECT", ":authority": authority });
const chunks = [];
req.on("response", (headers) => {
  result.status = headers[":status"];
});
req.on("data", (chunk) => chunks.push(chunk));
req.on("error", (err) => {
  result.error = String(err.message || err);
  finish(2);
});
req.on("end", () => {
  if (result.status === null) {
    // TLS 1.3: a server refusing our certificate does so after our side of the handshake is
    // done, so the refusal shows up as a stream that ends without any response.
    result.error = "stream ended without a response";
    finish(2);
  }
  const reply = Buffer.concat(chunks);
  result.received = reply.length;
  const digest = crypto.createHash("sha256").update(payload).digest();
  const echoed = reply.length === 32 + payload.length && reply.subarray(0, 32).equals(digest) &&
    reply.subarray(32).equals(payload);
  result.ok = result.status === 200 && echoed && (result.san || []).includes(expectedSan);
  session.close();
  finish(result.ok ? 0 : 1);
});
req.write("E");
req.end(payload);
