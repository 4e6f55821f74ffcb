"""grpcio (Debian's python3-grpcio), server and client of the HTTP/2 end-to-end test
(tests/tests/h2.rs); no generated code: a generic handler serves every method, messages are raw
bytes (no serializers).

    grpc_stack.py server PORT        serves every method on [::]:PORT (both families)
    grpc_stack.py client PLAN OUT    runs PLAN (JSON), writes what each call got to OUT

A request's body is b"code=N": the call ends with grpc-status N (0: OK, the reply b"ok"). Every
call's trailers carry x-peer-port, the client's port as the server saw it.

The plan: {"channels": [{"target": "HOST:PORT", "burst": false, "calls": [{"method":
"/pkg.Service/Method", "code": N}, ...]}, ...]}. Each channel is one connection (a subchannel pool
of its own); channels run at once; a channel's calls go one after another (call i is then stream 2i+1), or all at once
when burst is set. OUT gets one JSON object per call and line: channel, call, method, the code
received and the port from the trailers.
"""

import json
import sys
import threading
from concurrent import futures

import grpc

CODES = {c.value[0]: c for c in grpc.StatusCode}


def peer_port(context):
    # "ipv4:198.18.1.2:40000", "ipv6:[2001:2:0:1::2]:40000" (brackets maybe %-encoded)
    return context.peer().rsplit(":", 1)[1]


def handle(request, context):
    context.set_trailing_metadata((("x-peer-port", peer_port(context)),))
    try:
        code = int(request.decode().removeprefix("code="))
    except ValueError:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request %r" % request)
    if code:
        context.abort(CODES[code], "requested")
    return b"ok"


class Generic(grpc.GenericRpcHandler):
    def service(self, handler_call_details):
        return grpc.unary_unary_rpc_method_handler(handle)


def serve(port):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((Generic(),))
    server.add_insecure_port("[::]:%d" % port)
    server.start()
    server.wait_for_termination()


def outcome(call):
    """(code, port) of a finished call (a grpc.Call, or the RpcError that is one)."""
    port = dict(call.trailing_metadata() or ()).get("x-peer-port", "0")
    return call.code().value[0], int(port)


def one(channel, method, code):
    stub = channel.unary_unary(method)
    try:
        _, call = stub.with_call(b"code=%d" % code, timeout=10)
    except grpc.RpcError as e:
        call = e
    return outcome(call)


def run(index, plan_channel, out):
    calls = plan_channel["calls"]
    # A subchannel pool of its own: channels to one target would share a connection.
    options = (("grpc.use_local_subchannel_pool", 1),)
    with grpc.insecure_channel(plan_channel["target"], options=options) as channel:
        if plan_channel.get("burst"):
            pending = [channel.unary_unary(c["method"]).future(b"code=%d" % c["code"], timeout=10) for c in calls]
            got = [outcome(f) for f in pending]
        else:
            got = [one(channel, c["method"], c["code"]) for c in calls]
    out[index] = [
        {"channel": index, "call": i, "method": c["method"], "code": code, "port": port}
        for i, (c, (code, port)) in enumerate(zip(calls, got))
    ]


def client(plan_file, out_file):
    with open(plan_file) as f:
        plan = json.load(f)
    out = [None] * len(plan["channels"])
    threads = [threading.Thread(target=run, args=(i, c, out)) for i, c in enumerate(plan["channels"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(out_file, "w") as f:
        for records in out:
            for r in records:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: grpc_stack.py server PORT | client PLAN OUT")
