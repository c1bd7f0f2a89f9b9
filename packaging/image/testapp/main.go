// Command meshtest is the test workload of meshctl's suite: one static binary that serves HTTP,
// TCP and gRPC health, and the client that calls them. Standard library only (Go >= 1.24 speaks
// HTTP/2 without TLS, which gRPC and the kubelet's gRPC probe use).
//
//	meshtest serve [--http :8080] [--tcp :9000] [--grpc :9090] [--name NAME] [--grpc-service S]...
//	meshtest http [-X METHOD] [-H 'Name: value']... [-d BODY] [--h2c] [--timeout 5s] URL
//	meshtest tcp [--send TEXT] [--timeout 5s] HOST:PORT
//	meshtest grpc-health [--service S] [--timeout 5s] HOST:PORT
//	meshtest version
//
// serve: HTTP (HTTP/1.1 and prior-knowledge h2c on one port) answers every path with a JSON echo
// of the request (name, hostname, method, path, host, proto, remote and local address, headers,
// body size); /status/NNN answers with that status; /healthz answers 200, or 503 once
// POST /healthz?healthy=false was called (true turns it back). TCP echoes every byte back until
// the client half-closes. gRPC: grpc.health.v1.Health/Check and Watch (SERVING for "" and every
// --grpc-service while healthy, NOT_SERVING when not, NOT_FOUND for other services); any other
// method is UNIMPLEMENTED. SIGTERM or SIGINT: stop accepting, finish in-flight requests, exit 0.
// Each request is logged as one line on stdout.
//
// Clients print what they received on stdout and a one-line reason on stderr; exit 0 on success
// (HTTP status below 400, TCP reply read to EOF, health SERVING), 1 otherwise, 2 on bad usage.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const version = "meshtest 1"

var healthy atomic.Bool

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	log.SetFlags(0)
	log.SetOutput(os.Stdout)
	if len(os.Args) < 2 {
		usage("")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "serve":
		os.Exit(serve(args))
	case "http":
		os.Exit(httpClient(args))
	case "tcp":
		os.Exit(tcpClient(args))
	case "grpc-health":
		os.Exit(grpcHealthClient(args))
	case "version", "--version":
		fmt.Println(version)
	default:
		usage("unknown command " + strconv.Quote(os.Args[1]))
	}
}

func usage(problem string) {
	if problem != "" {
		fmt.Fprintln(os.Stderr, "meshtest: "+problem)
	}
	fmt.Fprintln(os.Stderr, "usage: meshtest serve|http|tcp|grpc-health|version [flags] (see -h of each)")
	os.Exit(2)
}

func parse(fs *flag.FlagSet, args []string, positional int) []string {
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		os.Exit(2)
	}
	if fs.NArg() != positional {
		usage(fmt.Sprintf("%s takes %d argument(s) after its flags, got %d", fs.Name(), positional, fs.NArg()))
	}
	return fs.Args()
}

// ---- server ---------------------------------------------------------------------------------

func serve(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	httpAddr := fs.String("http", ":8080", "HTTP/1.1 + h2c listen address (empty: off)")
	tcpAddr := fs.String("tcp", ":9000", "TCP echo listen address (empty: off)")
	grpcAddr := fs.String("grpc", ":9090", "gRPC health listen address (empty: off)")
	hostname, _ := os.Hostname()
	name := fs.String("name", hostname, "name reported in HTTP replies")
	var services multi
	fs.Var(&services, "grpc-service", "a gRPC health service name answered SERVING (repeatable)")
	parse(fs, args, 0)
	healthy.Store(true)

	var servers []*http.Server
	var listeners []net.Listener
	listen := func(addr string) net.Listener {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "meshtest: cannot listen on %s: %v\n", addr, err)
			os.Exit(1)
		}
		listeners = append(listeners, l)
		return l
	}
	start := func(addr string, handler http.Handler, h1 bool) {
		if addr == "" {
			return
		}
		protocols := new(http.Protocols)
		protocols.SetHTTP1(h1)
		protocols.SetUnencryptedHTTP2(true)
		server := &http.Server{Handler: handler, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, server)
		l := listen(addr)
		log.Printf("serving %s on %s", map[bool]string{true: "http", false: "grpc"}[h1], l.Addr())
		go func() {
			if err := server.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Printf("server on %s: %v", addr, err)
			}
		}()
	}
	start(*httpAddr, echoHandler(*name, hostname), true)
	start(*grpcAddr, grpcHandler(services), false)
	var tcpDone sync.WaitGroup
	var tcpListener net.Listener
	if *tcpAddr != "" {
		tcpListener = listen(*tcpAddr)
		log.Printf("serving tcp on %s", tcpListener.Addr())
		go acceptEcho(tcpListener, &tcpDone)
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	got := <-stop
	log.Printf("%s: shutting down", got)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if tcpListener != nil {
		tcpListener.Close()
	}
	for _, s := range servers {
		s.Shutdown(ctx)
	}
	tcpDone.Wait()
	return 0
}

func echoHandler(name, hostname string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		code := http.StatusOK
		switch {
		case r.URL.Path == "/healthz":
			if r.Method == http.MethodPost {
				if v := r.URL.Query().Get("healthy"); v != "" {
					healthy.Store(v == "true")
				}
			}
			if !healthy.Load() {
				code = http.StatusServiceUnavailable
			}
		case strings.HasPrefix(r.URL.Path, "/status/"):
			parsed, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
			if err != nil || parsed < 200 || parsed > 599 {
				code = http.StatusBadRequest
			} else {
				code = parsed
			}
		}
		local := ""
		if addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			local = addr.String()
		}
		headers := map[string]string{}
		for k, v := range r.Header {
			headers[k] = strings.Join(v, ",")
		}
		reply, _ := json.Marshal(map[string]any{
			"name": name, "hostname": hostname, "method": r.Method, "path": r.URL.Path,
			"query": r.URL.RawQuery, "host": r.Host, "proto": r.Proto, "remote": r.RemoteAddr,
			"local": local, "headers": headers, "body_bytes": n, "status": code,
		})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		w.Write(append(reply, '\n'))
		log.Printf("http %s %s %s from %s -> %d", r.Proto, r.Method, r.URL.RequestURI(), r.RemoteAddr, code)
	})
}

func acceptEcho(l net.Listener, done *sync.WaitGroup) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return // closed on shutdown
		}
		done.Add(1)
		go func() {
			defer done.Done()
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Minute))
			n, err := io.Copy(conn, conn)
			if tcp, ok := conn.(*net.TCPConn); ok {
				tcp.CloseWrite()
			}
			outcome := "ok"
			if err != nil {
				outcome = err.Error()
			}
			log.Printf("tcp from %s: echoed %d bytes (%s)", conn.RemoteAddr(), n, outcome)
		}()
	}
}

// gRPC over HTTP/2 (PROTOCOL-HTTP2.md of grpc/grpc): a message is a 1-byte compressed flag, a
// 4-byte big-endian length and the protobuf bytes; the status travels in the grpc-status trailer.
const (
	healthServing     = 1
	healthNotServing  = 2
	grpcOK            = 0
	grpcNotFound      = 5
	grpcUnimplemented = 12
	grpcInternal      = 13
)

func grpcHandler(services multi) http.Handler {
	known := map[string]bool{"": true}
	for _, s := range services {
		known[s] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		finish := func(code int, message string) {
			w.Header().Set("Grpc-Status", strconv.Itoa(code))
			if message != "" {
				w.Header().Set("Grpc-Message", message)
			}
			log.Printf("grpc %s from %s -> status %d %s", r.URL.Path, r.RemoteAddr, code, message)
		}
		if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			w.WriteHeader(http.StatusUnsupportedMediaType)
			return
		}
		if r.URL.Path != "/grpc.health.v1.Health/Check" && r.URL.Path != "/grpc.health.v1.Health/Watch" {
			finish(grpcUnimplemented, "unknown method "+r.URL.Path)
			return
		}
		request, err := readMessage(r.Body)
		if err != nil {
			finish(grpcInternal, "bad request message: "+err.Error())
			return
		}
		service := protoString(request, 1) // HealthCheckRequest.service = 1
		if !known[service] {
			finish(grpcNotFound, "unknown service "+strconv.Quote(service))
			return
		}
		status := healthNotServing
		if healthy.Load() {
			status = healthServing
		}
		w.WriteHeader(http.StatusOK)
		w.Write(message([]byte{0x08, byte(status)})) // HealthCheckResponse.status = 1 (enum)
		if r.URL.Path == "/grpc.health.v1.Health/Watch" {
			http.NewResponseController(w).Flush()
			<-r.Context().Done() // a stream: the client ends it
		}
		finish(grpcOK, "")
	})
}

func message(payload []byte) []byte {
	out := make([]byte, 5, 5+len(payload))
	binary.BigEndian.PutUint32(out[1:], uint32(len(payload)))
	return append(out, payload...)
}

func readMessage(r io.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	if head[0] != 0 {
		return nil, errors.New("compressed messages are not supported")
	}
	size := binary.BigEndian.Uint32(head[1:])
	if size > 1<<16 {
		return nil, errors.New("message too large")
	}
	body := make([]byte, size)
	_, err := io.ReadFull(r, body)
	return body, err
}

// protoString returns field `field` of wire type 2 (length-delimited) from a protobuf message,
// skipping the others; "" when absent or malformed.
func protoString(msg []byte, field uint64) string {
	for len(msg) > 0 {
		key, n := binary.Uvarint(msg)
		if n <= 0 {
			return ""
		}
		msg = msg[n:]
		switch key & 7 {
		case 0:
			_, n = binary.Uvarint(msg)
			if n <= 0 {
				return ""
			}
			msg = msg[n:]
		case 2:
			size, n := binary.Uvarint(msg)
			if n <= 0 || uint64(len(msg)-n) < size {
				return ""
			}
			if key>>3 == field {
				return string(msg[n : n+int(size)])
			}
			msg = msg[n+int(size):]
		default:
			return ""
		}
	}
	return ""
}

// ---- clients --------------------------------------------------------------------------------

func fail(format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "meshtest: "+format+"\n", a...)
	return 1
}

func httpClient(args []string) int {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	method := fs.String("X", "GET", "request method")
	var headers multi
	fs.Var(&headers, "H", "a request header 'Name: value' (repeatable)")
	data := fs.String("d", "", "request body")
	h2c := fs.Bool("h2c", false, "HTTP/2 without TLS (prior knowledge) instead of HTTP/1.1")
	timeout := fs.Duration("timeout", 5*time.Second, "whole-request timeout")
	url := parse(fs, args, 1)[0]
	protocols := new(http.Protocols)
	if *h2c {
		protocols.SetUnencryptedHTTP2(true)
	} else {
		protocols.SetHTTP1(true)
	}
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{Protocols: protocols}}
	var body io.Reader
	if *data != "" {
		body = strings.NewReader(*data)
	}
	req, err := http.NewRequest(*method, url, body)
	if err != nil {
		fmt.Fprintln(os.Stderr, "meshtest: "+err.Error())
		return 2
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			fmt.Fprintf(os.Stderr, "meshtest: -H %q is not 'Name: value'\n", h)
			return 2
		}
		if strings.EqualFold(strings.TrimSpace(name), "host") {
			req.Host = strings.TrimSpace(value)
		} else {
			req.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fail("%s %s: %v", *method, url, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(os.Stdout, resp.Body); err != nil {
		return fail("reading the response of %s: %v", url, err)
	}
	fmt.Fprintf(os.Stderr, "%s %s\n", resp.Proto, resp.Status)
	if resp.StatusCode >= 400 {
		return 1
	}
	return 0
}

func tcpClient(args []string) int {
	fs := flag.NewFlagSet("tcp", flag.ContinueOnError)
	send := fs.String("send", "hello\n", "bytes to send before half-closing")
	timeout := fs.Duration("timeout", 5*time.Second, "connect + exchange timeout")
	addr := parse(fs, args, 1)[0]
	conn, err := net.DialTimeout("tcp", addr, *timeout)
	if err != nil {
		return fail("connect %s: %v", addr, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(*timeout))
	if _, err := io.WriteString(conn, *send); err != nil {
		return fail("send to %s: %v", addr, err)
	}
	conn.(*net.TCPConn).CloseWrite()
	n, err := io.Copy(os.Stdout, bufio.NewReader(conn))
	if err != nil {
		return fail("read from %s after %d bytes: %v", addr, n, err)
	}
	return 0
}

func grpcHealthClient(args []string) int {
	fs := flag.NewFlagSet("grpc-health", flag.ContinueOnError)
	service := fs.String("service", "", "the service to ask about")
	timeout := fs.Duration("timeout", 5*time.Second, "call timeout")
	addr := parse(fs, args, 1)[0]
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{Protocols: protocols}}
	request := []byte{}
	if *service != "" {
		request = append([]byte{0x0a}, binary.AppendUvarint(nil, uint64(len(*service)))...)
		request = append(request, *service...)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/grpc.health.v1.Health/Check",
		bytes.NewReader(message(request)))
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		return fail("health check of %s: %v", addr, err)
	}
	defer resp.Body.Close()
	reply, readErr := readMessage(resp.Body)
	io.Copy(io.Discard, resp.Body)
	status := resp.Trailer.Get("Grpc-Status")
	if status == "" {
		status = resp.Header.Get("Grpc-Status") // a trailers-only response
	}
	if status != "0" {
		return fail("health check of %s: grpc-status %s %s", addr, status, resp.Trailer.Get("Grpc-Message"))
	}
	if readErr != nil || len(reply) != 2 || reply[0] != 0x08 {
		return fail("health check of %s: unexpected reply %x", addr, reply)
	}
	names := map[byte]string{0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
	fmt.Println(names[reply[1]])
	if reply[1] != healthServing {
		return 1
	}
	return 0
}
