// An adversarial HBONE peer (Node.js built-in http2 + tls, no packages): many streams on one
// connection, some reset at chosen points while the others move checksummed bytes.
//
// usage: node hbone_chaos.js client HOST PORT PLAN_JSON ROOTS_PEM CERT_DIR
//        node hbone_chaos.js server HOST PORT CERT_DIR
//
// client: one mTLS HTTP/2 connection to HOST:PORT; PLAN_JSON lists streams
//   [{authority, kind, size, at}], all opened at once. Kinds (modes of the test echo server):
//   "up"   sibling: "E" + size random bytes, half-close, expect sha256 + the bytes back
//   "down" sibling: "S" + size (8 bytes BE), expect the deterministic pattern of size bytes
//   "reset_before_200"  CONNECT, RST_STREAM(CANCEL) before any answer
//   "reset_after_200"   RST_STREAM on the 200
//   "reset_mid_upload"  "E" + size bytes planned, RST after `at` bytes were written
//   "reset_mid_download" "S" + size, RST after `at` bytes arrived
//   "reset_blocked"     "S" + size, never read (our side fills its window and holds bytes),
//                       RST after `at` ms
//   "app_reset"         "R" + `at` (8 bytes) + size bytes: the app reads `at` bytes, then resets
//                       its socket (TCP RST) with our bytes unread
//   "refused"           CONNECT to an authority nobody serves: any non-200 answer
//   Then one more "up" sibling on the same connection. Prints one JSON line:
//   {siblings, intact, victims, failures: [...], sessions, goaway, sessionError}.
// server: mTLS (client certificate required) on HOST:PORT; every CONNECT gets a behaviour from
//   its :authority port: 8080 sibling (the test echo server's modes E and S), 9101 reset before
//   200, 9102 reset after 200, 9103 reset after 64 KiB of upload arrived (unread data left),
//   9104 reset after 256 KiB of download were written, 9105 200 then never read, reset after
//   300 ms (the client is held by flow control). Prints {"listening": PORT}, then at SIGTERM
//   {sessions, streams, siblings, sessionErrors}.
"use strict";
const crypto = require("node:crypto");
const fs = require("node:fs");
const http2 = require("node:http2");
const path = require("node:path");
const tls = require("node:tls");

const { NGHTTP2_CANCEL } = http2.constants;

function pattern(n) {
  // The test echo server's deterministic bytes: sha256(n as 8 bytes BE) * 2048, repeated.
  const seed = Buffer.alloc(8);
  seed.writeBigUInt64BE(BigInt(n));
  const block = Buffer.concat(Array(2048).fill(crypto.createHash("sha256").update(seed).digest()));
  const out = Buffer.alloc(n);
  for (let i = 0; i < n; i += block.length) block.copy(out, i, 0, Math.min(block.length, n - i));
  return out;
}

function u64(n) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

function print(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

// -- client ------------------------------------------------------------------------------------

function client(host, port, plan, roots, certDir) {
  const read = (name) => fs.readFileSync(path.join(certDir, name));
  const options = {
    host, port: Number(port), ca: fs.readFileSync(roots), cert: read("cert-chain.pem"),
    key: read("key.pem"), ALPNProtocols: ["h2"], minVersion: "TLSv1.3",
    checkServerIdentity: () => undefined,
  };
  const result = {
    siblings: 0, intact: 0, victims: 0, failures: [], sessions: 1, goaway: null,
    sessionError: null,
  };
  const session = http2.connect(`https://${host}:${port}`, {
    createConnection: () => tls.connect(options),
    maxSessionMemory: 512,  // as the server's: Node's 10 MB default would refuse streams
  });
  session.on("goaway", (code, last, data) => {
    result.goaway = { code, debug: data ? data.toString() : "" };
  });
  session.on("error", (err) => { result.sessionError = String(err.message || err); });
  setTimeout(() => {
    result.failures.push("timeout");
    print(result);
    process.exit(3);
  }, 120000).unref();

  function sibling(step, i, done) {
    result.siblings += 1;
    const req = session.request({ ":method": "CONNECT", ":authority": step.authority });
    const chunks = [];
    let expected;
    req.on("response", (h) => {
      if (h[":status"] !== 200) result.failures.push(`${i}: status ${h[":status"]}`);
    });
    req.on("data", (c) => chunks.push(c));
    req.on("error", (e) => result.failures.push(`${i} ${step.kind}: ${e.message}`));
    req.on("close", () => {
      const got = Buffer.concat(chunks);
      if (expected !== undefined && got.equals(expected)) result.intact += 1;
      else if (!req.rstCode) result.failures.push(`${i} ${step.kind}: ${got.length} bytes wrong`);
      else result.failures.push(`${i} ${step.kind}: reset ${req.rstCode}`);
      done();
    });
    if (step.kind === "up") {
      const body = crypto.randomBytes(step.size);
      expected = Buffer.concat([crypto.createHash("sha256").update(body).digest(), body]);
      req.write("E");
      req.end(body);
    } else {
      expected = pattern(step.size);
      req.write(Buffer.concat([Buffer.from("S"), u64(step.size)]));
      req.on("end", () => req.end());
    }
  }

  function victim(step, i, done) {
    result.victims += 1;
    const req = session.request({ ":method": "CONNECT", ":authority": step.authority });
    let finished = false;
    const finish = () => {
      if (!finished) { finished = true; done(); }
    };
    req.on("error", () => {});
    req.on("close", finish);
    const reset = () => { if (!req.closed) req.close(NGHTTP2_CANCEL); };
    if (step.kind === "reset_before_200") {
      setImmediate(reset);
      return;
    }
    req.on("response", (h) => {
      if (step.kind === "reset_after_200") reset();
      if (step.kind === "refused" && h[":status"] === 200) {
        result.failures.push(`${i} refused: got 200`);
      }
    });
    if (step.kind === "reset_mid_upload") {
      req.write("E");
      let written = 0;
      const piece = crypto.randomBytes(16384);
      const pump = () => {
        while (written < step.at && !req.closed) {
          written += piece.length;
          if (!req.write(piece)) { req.once("drain", pump); return; }
        }
        reset();
      };
      pump();
    } else if (step.kind === "reset_mid_download") {
      req.write(Buffer.concat([Buffer.from("S"), u64(step.size)]));
      let got = 0;
      req.on("data", (c) => { got += c.length; if (got >= step.at) reset(); });
    } else if (step.kind === "reset_blocked") {
      req.write(Buffer.concat([Buffer.from("S"), u64(step.size)]));
      req.pause();  // never read: the window closes, the other side holds its bytes
      setTimeout(reset, step.at);
    } else if (step.kind === "app_reset") {
      req.write(Buffer.concat([Buffer.from("R"), u64(step.at)]));
      req.end(crypto.randomBytes(step.size));
      req.resume();
    } else if (step.kind === "refused") {
      req.end();
      req.resume();
    }
  }

  let pending = plan.length;
  const afterAll = () => {
    // The connection must still serve a new stream after all that.
    sibling({ kind: "up", size: 100000, authority: plan.find((s) => s.kind === "up").authority },
      "last", () => {
        session.close();
        print(result);
        process.exit(0);
      });
  };
  plan.forEach((step, i) => {
    const done = () => { pending -= 1; if (pending === 0) afterAll(); };
    if (step.kind === "up" || step.kind === "down") sibling(step, i, done);
    else victim(step, i, done);
  });
}

// -- server ------------------------------------------------------------------------------------

function server(host, port, certDir) {
  const read = (name) => fs.readFileSync(path.join(certDir, name));
  const stats = { sessions: 0, streams: 0, siblings: 0, sessionErrors: [] };
  const srv = http2.createSecureServer({
    cert: read("cert-chain.pem"), key: read("key.pem"), ca: read("root-cert.pem"),
    requestCert: true, rejectUnauthorized: true, minVersion: "TLSv1.3", ALPNProtocols: ["h2"],
    allowHTTP1: false,
    // Node refuses new streams with ENHANCE_YOUR_CALM once a session buffers 10 MB (its
    // default): the echoes of 30 siblings on one connection do. Not what is tested here.
    maxSessionMemory: 512,
  });
  srv.on("session", (s) => {
    stats.sessions += 1;
    s.on("error", (e) => stats.sessionErrors.push(String(e.message || e)));
  });
  srv.on("stream", (stream, headers) => {
    stats.streams += 1;
    stream.on("error", () => {});
    const behaviour = Number((headers[":authority"] || "").split(":").pop());
    const reset = () => { if (!stream.closed) stream.close(NGHTTP2_CANCEL); };
    if (behaviour === 9101) { reset(); return; }
    stream.respond({ ":status": 200 });
    if (behaviour === 9102) { reset(); return; }
    if (behaviour === 9103) {
      let got = 0;
      stream.on("data", (c) => { got += c.length; if (got >= 65536) reset(); });
      return;
    }
    if (behaviour === 9104) {
      const piece = Buffer.alloc(16384, 7);
      let sent = 0;
      const pump = () => {
        while (sent < 262144 && !stream.closed) {
          sent += piece.length;
          if (!stream.write(piece)) { stream.once("drain", pump); return; }
        }
        reset();
      };
      pump();
      stream.resume();
      return;
    }
    if (behaviour === 9105) {
      stream.pause();
      setTimeout(reset, 300);
      return;
    }
    stats.siblings += 1;
    echo(stream);
  });
  srv.on("sessionError", (e) => stats.sessionErrors.push(String(e.message || e)));
  srv.listen(Number(port), host, () => print({ listening: Number(port) }));
  process.on("SIGTERM", () => { print(stats); process.exit(0); });
}

function echo(stream) {
  // The test echo server's modes: E (echo sha256 + bytes at END_STREAM), S + N (send N pattern
  // bytes and half-close, then read to the end).
  const chunks = [];
  let mode = null;
  stream.on("data", (c) => {
    chunks.push(c);
    if (mode === null) {
      const head = Buffer.concat(chunks);
      if (head[0] === 0x53 && head.length >= 9) {
        mode = "S";
        stream.end(pattern(Number(head.readBigUInt64BE(1))));
      } else if (head[0] === 0x45) {
        mode = "E";
      }
    }
  });
  stream.on("end", () => {
    if (mode !== "E") return;
    const body = Buffer.concat(chunks).subarray(1);
    stream.end(Buffer.concat([crypto.createHash("sha256").update(body).digest(), body]));
  });
}

const [role, ...args] = process.argv.slice(2);
if (role === "client") {
  const [host, port, planJson, roots, certDir] = args;
  client(host, port, JSON.parse(planJson), roots, certDir);
} else {
  const [host, port, certDir] = args;
  server(host, port, certDir);
}
