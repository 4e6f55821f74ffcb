// An S3-compatible server for the upload tests: gofakes3 (MIT) over HTTP on the address given,
// its objects in a bbolt file that outlives the process (so a server stopped and started again
// on the same file has what it had), the bucket created at start. Each request it answers is
// one line of JSON on stdout (method, path, status, bytes received, the access key id of its
// SigV4 signature), which the tests count PUTs and check credentials with.
//
//	s3-server -listen 127.0.0.1:9000 -db /tmp/s3.db -bucket captures
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
)

type line struct {
	Method    string `json:"method"`
	Path      string `json:"path"`
	Status    int    `json:"status"`
	Bytes     int64  `json:"bytes"`
	AccessKey string `json:"access_key"`
}

type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// accessKey is the key id of an `AWS4-HMAC-SHA256 Credential=KEY/date/region/s3/aws4_request, ...`.
func accessKey(auth string) string {
	_, rest, ok := strings.Cut(auth, "Credential=")
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(rest, "/")
	return key
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	db := flag.String("db", "s3.db", "the bbolt file of the objects")
	bucket := flag.String("bucket", "captures", "bucket created at start")
	flag.Parse()

	backend, err := s3bolt.NewFile(*db)
	if err != nil {
		log.Fatalf("opening %s: %v", *db, err)
	}
	if err := backend.CreateBucket(*bucket); err != nil && !gofakes3.IsAlreadyExists(err) {
		log.Fatalf("creating bucket %s: %v", *bucket, err)
	}
	s3 := gofakes3.New(backend, gofakes3.WithoutVersioning())
	handler := s3.Server()
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		handler.ServeHTTP(rec, r)
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(line{r.Method, r.URL.Path, rec.status, r.ContentLength, accessKey(r.Header.Get("Authorization"))})
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listening on %s: %v", *listen, err)
	}
	log.Printf("serving bucket %s from %s on %s", *bucket, *db, ln.Addr())
	log.Fatal(http.Serve(ln, logged))
}
