// @grpc/grpc-js, server and client of the HTTP/2 end-to-end test (tests/tests/h2.rs); no
// generated code: every method is unary with raw Buffer messages (identity serializers), and
// NODE_PATH names where the package was installed.
//
//   node grpc_stack.js server PORT        serves the plan's methods on [::]:PORT (both families)
//   node grpc_stack.js client PLAN OUT    runs PLAN (JSON), writes what each call got to OUT
//
// A request's body is "code=N": the call ends with grpc-status N (0: OK, the reply "ok"). Every
// call's trailers carry x-peer-port, the client's port as the server saw it.
//
// The plan: {"channels": [{"target": "HOST:PORT", "burst": false, "calls": [{"method":
// "/pkg.Service/Method", "code": N}, ...]}. Each channel is one connection (a subchannel pool of
// its own); channels run at once; a channel's calls go one after another (call i is then stream 2i+1), or all at once
// when burst is set. OUT gets one JSON object per call and line: channel, call, method, the
// code received and the port from the trailers.
"use strict";

const fs = require("fs");
const grpc = require("@grpc/grpc-js");

// The methods served: grpc-js routes by full path, with no handler for unknown ones.
const METHODS = ["/helloworld.Greeter/SayHello", "/mirror.Inventory/Get"];
const identity = (b) => b;

function method(path) {
  return {
    path,
    requestStream: false,
    responseStream: false,
    requestSerialize: identity,
    requestDeserialize: identity,
    responseSerialize: identity,
    responseDeserialize: identity,
  };
}

function serve(port) {
  const server = new grpc.Server();
  const service = {};
  const handlers = {};
  for (const path of METHODS) {
    service[path] = method(path);
    handlers[path] = (call, callback) => {
      const trailer = new grpc.Metadata();
      trailer.set("x-peer-port", call.getPeer().split(":").pop());
      const code = Number(call.request.toString().replace(/^code=/, ""));
      if (!Number.isInteger(code)) {
        callback({ code: grpc.status.INVALID_ARGUMENT, details: "bad request", metadata: trailer });
      } else if (code !== 0) {
        callback({ code, details: "requested", metadata: trailer });
      } else {
        callback(null, Buffer.from("ok"), trailer);
      }
    };
  }
  server.addService(service, handlers);
  server.bindAsync(`[::]:${port}`, grpc.ServerCredentials.createInsecure(), (err) => {
    if (err) throw err;
  });
}

function one(client, path, code) {
  return new Promise((resolve) => {
    let port = 0;
    const call = client.makeUnaryRequest(
      path,
      identity,
      identity,
      Buffer.from(`code=${code}`),
      new grpc.Metadata(),
      { deadline: Date.now() + 10000 },
      () => {},
    );
    call.on("status", (s) => {
      const v = s.metadata.get("x-peer-port");
      if (v.length === 1) port = Number(v[0]);
      resolve({ code: s.code, port });
    });
  });
}

async function run(index, ch) {
  // A subchannel pool of its own: clients of one target would share a connection.
  const client = new grpc.Client(ch.target, grpc.credentials.createInsecure(), {
    "grpc.use_local_subchannel_pool": 1,
  });
  let got;
  if (ch.burst) {
    got = await Promise.all(ch.calls.map((c) => one(client, c.method, c.code)));
  } else {
    got = [];
    for (const c of ch.calls) got.push(await one(client, c.method, c.code));
  }
  client.close();
  return got.map((g, i) => ({ channel: index, call: i, method: ch.calls[i].method, code: g.code, port: g.port }));
}

async function client(planFile, outFile) {
  const plan = JSON.parse(fs.readFileSync(planFile, "utf8"));
  const all = await Promise.all(plan.channels.map((ch, i) => run(i, ch)));
  fs.writeFileSync(outFile, all.flat().map((r) => JSON.stringify(r) + "\n").join(""));
}

const args = process.argv.slice(2);
if (args.length === 2 && args[0] === "server") {
  serve(Number(args[1]));
} else if (args.length === 3 && args[0] === "client") {
  client(args[1], args[2]).catch((e) => {
    console.error(e);
    process.exit(1);
  });
} else {
  console.error("usage: node grpc_stack.js server PORT | client PLAN OUT");
  process.exit(2);
}
