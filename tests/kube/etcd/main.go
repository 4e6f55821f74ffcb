// etcd for the tests' API server: the etcd server's own entry point, built from its Go module
// at the version the Kubernetes module requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
