// Go's own DNS resolver as a client of the DNS tests (main.go): the standard library only.
module mirror-e2e/dns/resolver

go 1.26.0
