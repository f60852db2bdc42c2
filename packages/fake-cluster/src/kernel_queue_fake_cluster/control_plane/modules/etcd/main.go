// etcd's server, built from the go.etcd.io/etcd/server/v3 module (whose own go.mod has replace
// directives, so it cannot be installed with `go install`).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
