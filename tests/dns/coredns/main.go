// CoreDNS as the DNS tests run it (tests/tests/dns.rs): the server of its Go module with the
// plugins the tests' Corefile uses, in the order CoreDNS chains them (its plugin.cfg order),
// built the way CoreDNS documents custom builds.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
)

func init() {
	dnsserver.Directives = []string{"bind", "errors", "file", "forward"}
}

func main() {
	coremain.Run()
}
