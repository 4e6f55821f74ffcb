// grpc-go, server and client of the HTTP/2 end-to-end test (tests/tests/h2.rs); no generated
// code: messages are raw bytes (a codec that passes them through, named "proto" so that the
// content-type stays application/grpc).
//
//	grpc-stack server PORT        serves every method on [::]:PORT (both families)
//	grpc-stack client PLAN OUT    runs PLAN (JSON), writes what each call got to OUT
//
// A request's body is "code=N": the call ends with grpc-status N (0: OK, the reply "ok"). Every
// call's trailers carry x-peer-port, the client's port as the server saw it.
//
// The plan: {"channels": [{"target": "HOST:PORT", "burst": false, "calls": [{"method":
// "/pkg.Service/Method", "code": N}, ...]}, ...]}. Each channel is one connection; channels run
// at once; a channel's calls go one after another (call i is then stream 2i+1), or all at
// once when burst is set. OUT gets one JSON object per call and line: channel, call, method,
// the code received and the port from the trailers.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// rawCodec passes messages through as bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case []byte:
		return m, nil
	case *[]byte:
		return *m, nil
	}
	return nil, fmt.Errorf("raw codec: %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: %T", v)
	}
	*m = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func serve(port string) {
	lis, err := net.Listen("tcp", "[::]:"+port)
	if err != nil {
		panic(err)
	}
	handler := func(_ any, stream grpc.ServerStream) error {
		var req []byte
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		if p, ok := peer.FromContext(stream.Context()); ok {
			if _, port, err := net.SplitHostPort(p.Addr.String()); err == nil {
				stream.SetTrailer(metadata.Pairs("x-peer-port", port))
			}
		}
		code, err := strconv.Atoi(strings.TrimPrefix(string(req), "code="))
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "bad request %q", req)
		}
		if code != 0 {
			return status.Error(codes.Code(code), "requested")
		}
		return stream.SendMsg([]byte("ok"))
	}
	s := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(handler))
	if err := s.Serve(lis); err != nil {
		panic(err)
	}
}

type call struct {
	Method string `json:"method"`
	Code   int    `json:"code"`
}

type channel struct {
	Target string `json:"target"`
	Burst  bool   `json:"burst"`
	Calls  []call `json:"calls"`
}

type plan struct {
	Channels []channel `json:"channels"`
}

type record struct {
	Channel int    `json:"channel"`
	Call    int    `json:"call"`
	Method  string `json:"method"`
	Code    int    `json:"code"`
	Port    int    `json:"port"`
}

func run(ch int, c channel) []record {
	conn, err := grpc.NewClient(c.Target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	out := make([]record, len(c.Calls))
	one := func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var trailer metadata.MD
		var reply []byte
		req := []byte(fmt.Sprintf("code=%d", c.Calls[i].Code))
		err := conn.Invoke(ctx, c.Calls[i].Method, req, &reply, grpc.ForceCodec(rawCodec{}), grpc.Trailer(&trailer))
		port := 0
		if v := trailer.Get("x-peer-port"); len(v) == 1 {
			port, _ = strconv.Atoi(v[0])
		}
		out[i] = record{Channel: ch, Call: i, Method: c.Calls[i].Method, Code: int(status.Code(err)), Port: port}
	}
	if c.Burst {
		var wg sync.WaitGroup
		for i := range c.Calls {
			wg.Add(1)
			go func() { defer wg.Done(); one(i) }()
		}
		wg.Wait()
	} else {
		for i := range c.Calls {
			one(i)
		}
	}
	return out
}

func client(planFile, outFile string) {
	data, err := os.ReadFile(planFile)
	if err != nil {
		panic(err)
	}
	var p plan
	if err := json.Unmarshal(data, &p); err != nil {
		panic(err)
	}
	results := make([][]record, len(p.Channels))
	var wg sync.WaitGroup
	for i, c := range p.Channels {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = run(i, c) }()
	}
	wg.Wait()
	var lines []byte
	for _, rs := range results {
		for _, r := range rs {
			b, _ := json.Marshal(r)
			lines = append(append(lines, b...), '\n')
		}
	}
	if err := os.WriteFile(outFile, lines, 0o644); err != nil {
		panic(err)
	}
}

func main() {
	switch {
	case len(os.Args) == 3 && os.Args[1] == "server":
		serve(os.Args[2])
	case len(os.Args) == 4 && os.Args[1] == "client":
		client(os.Args[2], os.Args[3])
	default:
		fmt.Fprintln(os.Stderr, "usage: grpc-stack server PORT | client PLAN OUT")
		os.Exit(2)
	}
}
