// An independent HTTP/2 client for the gateway tests: Node.js's http2 (nghttp2).
// usage: node gateway_h2_client.js URL SERVERNAME AUTHORITY COUNT BODY_BYTES
// Sends COUNT POSTs of BODY_BYTES pseudo-random bytes concurrently on one connection and prints
// one JSON line: the statuses, and each echoed body compared with what was sent.
"use strict";
const http2 = require("http2");
const crypto = require("crypto");

const [url, servername, authority, countText, sizeText] = process.argv.slice(2);
const count = Number(countText);
const size = Number(sizeText);
const session = http2.connect(url, { servername, rejectUnauthorized: false });
session.on("error", (err) => {
  console.log(JSON.stringify({ error: String(err) }));
  process.exit(1);
});

function one(i) {
  return new Promise((resolve, reject) => {
    const body = crypto.randomBytes(size);
    const req = session.request({
      ":method": "POST",
      ":path": `/api/node/${i}`,
      ":authority": authority,
    });
    let status = 0;
    const chunks = [];
    req.on("response", (headers) => { status = headers[":status"]; });
    req.on("data", (chunk) => chunks.push(chunk));
    req.on("end", () => {
      const echo = JSON.parse(Buffer.concat(chunks).toString());
      const got = Buffer.from(echo.body, "base64");
      resolve({ status, path: echo.path, same: got.equals(body), protocol: session.alpnProtocol });
    });
    req.on("error", reject);
    req.end(body);
  });
}

Promise.all(Array.from({ length: count }, (_, i) => one(i)))
  .then((results) => {
    console.log(JSON.stringify({ results }));
    session.close();
  })
  .catch((err) => {
    console.log(JSON.stringify({ error: String(err) }));
    process.exit(1);
  });
