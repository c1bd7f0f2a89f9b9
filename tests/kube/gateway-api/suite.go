//go:build tools

// Package gatewayapi only pins the Gateway API conformance suite: build.sh compiles the suite's own
// test binary (`go test -c sigs.k8s.io/gateway-api/conformance`), and the tools build tag keeps
// this file out of every build while `go mod tidy` still records the suite's dependencies.
package gatewayapi

import _ "sigs.k8s.io/gateway-api/conformance"
