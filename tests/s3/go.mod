// The S3-compatible server of the upload tests (main.go): gofakes3 with its bbolt backend.
module mirror-e2e/s3

go 1.26.0

require github.com/johannesboyne/gofakes3 v1.2.0

require (
	github.com/ryszard/goskiplist v0.0.0-20150312221310-2dfbae5fcf46 // indirect
	go.etcd.io/bbolt v1.3.5 // indirect
	gopkg.in/mgo.v2 v2.0.0-20180705113604-9856a29383ce // indirect
)
