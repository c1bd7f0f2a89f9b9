// An independent TLS client for the ClientHello reader's cross-check: Go's crypto/tls (its own
// TLS stack, no OpenSSL underneath; recent Go offers a post-quantum key share, a larger hello).
// usage: go run tls_hello_client.go PORT SERVERNAME ALPN VERSION
// Connects to 127.0.0.1:PORT offering SERVERNAME as SNI ("-" for none), the comma-separated
// ALPN list and exactly VERSION (1.2 or 1.3); the listener closes after reading the
// ClientHello, so the handshake's failure is the expected end.
package main

import (
	"crypto/tls"
	"net"
	"os"
	"strings"
	"time"
)

func main() {
	port, servername, alpn, version := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	pinned := uint16(tls.VersionTLS13)
	if version == "1.2" {
		pinned = tls.VersionTLS12
	}
	config := &tls.Config{
		NextProtos:         strings.Split(alpn, ","),
		MinVersion:         pinned,
		MaxVersion:         pinned,
		InsecureSkipVerify: true, // the listener never answers: nothing to verify
	}
	if servername != "-" {
		config.ServerName = servername
	}
	raw, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 20*time.Second)
	if err != nil {
		os.Exit(1)
	}
	_ = raw.SetDeadline(time.Now().Add(20 * time.Second))
	_ = tls.Client(raw, config).Handshake()
}
