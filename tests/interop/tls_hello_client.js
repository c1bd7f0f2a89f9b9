// An independent TLS client for the ClientHello reader's cross-check: Node.js's tls.
// usage: node tls_hello_client.js PORT SERVERNAME ALPN VERSION
// Connects to 127.0.0.1:PORT offering SERVERNAME as SNI ("-" for none), the comma-separated
// ALPN list and exactly VERSION (TLSv1.2 or TLSv1.3); the listener closes after reading the
// ClientHello, so the handshake's failure is the expected end.
"use strict";
const tls = require("tls");

const [port, servername, alpn, version] = process.argv.slice(2);
const options = {
  host: "127.0.0.1",
  port: Number(port),
  ALPNProtocols: alpn.split(","),
  minVersion: version,
  maxVersion: version,
  rejectUnauthorized: false,
};
if (servername !== "-") options.servername = servername;
const socket = tls.connect(options);
socket.on("error", () => process.exit(0));
socket.on("close", () => process.exit(0));
setTimeout(() => process.exit(2), 20000).unref();
