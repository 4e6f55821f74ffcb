"""An HTTP/2 cleartext server on the h2 package (Debian's python3-h2), for the HTTP/2 end-to-end
test (tests/tests/h2.rs): it speaks HTTP/2 from the first byte (prior knowledge) or after an
HTTP/1.1 request with `Upgrade: h2c` (answered 101, then that request's response on stream 1).

    h2c_server.py PORT    listens on [::]:PORT (both families), a thread per connection

`/fail` answers 500, `/status/N` N, anything else 200; every response carries x-peer-port, the
client's port as the server saw it, and a short body.
"""

import socket
import sys
import threading

import h2.config
import h2.connection
import h2.events

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def status_of(path):
    path = path.split("?", 1)[0]
    if path == "/fail":
        return 500
    if path.startswith("/status/"):
        return int(path[len("/status/"):])
    return 200


def respond(conn, stream, path, port):
    code = status_of(path)
    body = b"%d\n" % code
    conn.send_headers(
        stream,
        [(":status", str(code)), ("content-length", str(len(body))), ("x-peer-port", str(port))],
    )
    conn.send_data(stream, body, end_stream=True)


def upgrade(sock, conn, head):
    """Answers an HTTP/1.1 request that asks for h2c: 101, then HTTP/2 with that request as
    stream 1. Returns False when it is not such a request."""
    lines = head.decode("latin-1").split("\r\n")
    _, path, _ = lines[0].split(" ", 2)
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    if fields.get("upgrade", "").lower() != "h2c" or "http2-settings" not in fields:
        sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return None
    conn.initiate_upgrade_connection(fields["http2-settings"])
    sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
    return path


def serve(sock, port):
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
    buf = b""
    with sock:
        # Prior knowledge (the preface), or an HTTP/1.1 request's head first.
        while len(buf) < len(PREFACE) and PREFACE.startswith(buf[: len(PREFACE)]):
            data = sock.recv(65536)
            if not data:
                return
            buf += data
        if buf.startswith(PREFACE):
            conn.initiate_connection()
        else:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            path = upgrade(sock, conn, head)
            if path is None:
                return
            respond(conn, 1, path, port)
        sock.sendall(conn.data_to_send())
        paths = {}
        while True:
            if buf:
                events = conn.receive_data(buf)
                buf = b""
            else:
                data = sock.recv(65536)
                if not data:
                    return
                events = conn.receive_data(data)
            for ev in events:
                if isinstance(ev, h2.events.RequestReceived):
                    paths[ev.stream_id] = dict(ev.headers)[b":path"].decode()
                    if ev.stream_ended:
                        respond(conn, ev.stream_id, paths.pop(ev.stream_id), port)
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id in paths:
                    respond(conn, ev.stream_id, paths.pop(ev.stream_id), port)
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    sock.sendall(conn.data_to_send())
                    return
            out = conn.data_to_send()
            if out:
                sock.sendall(out)


listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
listener.bind(("::", int(sys.argv[1])))
listener.listen(128)
while True:
    s, addr = listener.accept()
    threading.Thread(target=serve, args=(s, addr[1]), daemon=True).start()
