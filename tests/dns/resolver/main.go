// Go's resolver (net.Resolver with PreferGo: the pure Go stub resolver most Go programs in a
// cluster use) as a client of the DNS tests: `resolver [-first-port N] NAME...` looks up each
// name's addresses (A and AAAA at once, each on a socket of its own) in turn, reading
// /etc/resolv.conf, and prints one JSON line per name: the addresses or the error, and every
// socket the resolver opened for the lookup (its transport, local and server addresses). With
// -first-port, the sockets are bound to N, N+1, ... in the order opened, so that no two of them
// share a port (an ephemeral port the kernel hands out again would make two lookups one flow).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"os"
	"sync"
	"time"
)

type socket struct {
	Transport string `json:"transport"`
	Local     string `json:"local"`
	Server    string `json:"server"`
}

type result struct {
	Name      string   `json:"name"`
	Addrs     []string `json:"addrs"`
	Error     string   `json:"error,omitempty"`
	NotFound  bool     `json:"not_found"`
	Temporary bool     `json:"temporary"`
	Timeout   bool     `json:"timeout"`
	Sockets   []socket `json:"sockets"`
}

func main() {
	firstPort := flag.Int("first-port", 0, "bind the sockets to this port and those after it (0: ephemeral ports)")
	flag.Parse()
	next := *firstPort
	var portMu sync.Mutex
	local := func(network string) net.Addr {
		if *firstPort == 0 {
			return nil
		}
		portMu.Lock()
		defer portMu.Unlock()
		port := next
		next++
		if network == "tcp" || network == "tcp4" || network == "tcp6" {
			return &net.TCPAddr{Port: port}
		}
		return &net.UDPAddr{Port: port}
	}
	out := json.NewEncoder(os.Stdout)
	for _, name := range flag.Args() {
		var mu sync.Mutex
		res := result{Name: name, Addrs: []string{}, Sockets: []socket{}}
		r := &net.Resolver{
			PreferGo: true,
			Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: local(network)}
				c, err := d.DialContext(ctx, network, address)
				if err == nil {
					mu.Lock()
					res.Sockets = append(res.Sockets, socket{network, c.LocalAddr().String(), c.RemoteAddr().String()})
					mu.Unlock()
				}
				return c, err
			},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := r.LookupIPAddr(ctx, name)
		cancel()
		for _, a := range addrs {
			res.Addrs = append(res.Addrs, a.IP.String())
		}
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) {
			res.Error, res.NotFound, res.Temporary, res.Timeout = dnsErr.Err, dnsErr.IsNotFound, dnsErr.IsTemporary, dnsErr.IsTimeout
		} else if err != nil {
			res.Error = err.Error()
		}
		mu.Lock()
		if err := out.Encode(res); err != nil {
			os.Exit(1)
		}
		mu.Unlock()
	}
}
