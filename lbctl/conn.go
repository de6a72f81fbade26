package lbctl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// globalOptions are the flags every command takes.
type globalOptions struct {
	server        string
	timeout       time.Duration
	tlsCert       string
	tlsKey        string
	tlsCA         string
	tlsServerName string
	output        string
	// stderr receives the warning that a node answers from a stale copy (warnStale).
	stderr io.Writer
	warned bool
	// answered is set once lbd itself answered a call (error or not): an UNAVAILABLE
	// error is then lbd's own (its fleet's store, its datapath opening), not a failure
	// to reach it.
	answered bool
}

func (o *globalOptions) register(root *cobra.Command) {
	server := os.Getenv(serverEnv)
	if server == "" {
		server = defaultServer
	}
	f := root.PersistentFlags()
	f.StringVarP(&o.server, "server", "s", server,
		"lbd API address: unix:///path, /path (Unix socket) or host:port (TCP, mutual TLS only); env "+serverEnv)
	f.DurationVar(&o.timeout, "timeout", defaultTimeout, "deadline of the whole command")
	f.StringVar(&o.tlsCert, "tls-cert", "", "client certificate (PEM) for a TCP server")
	f.StringVar(&o.tlsKey, "tls-key", "", "client private key (PEM) for a TCP server")
	f.StringVar(&o.tlsCA, "tls-ca", "", "CA bundle (PEM) that signs the server's certificate; system roots if empty")
	f.StringVar(&o.tlsServerName, "tls-server-name", "", "name to verify in the server's certificate; the host of --server if empty")
	addChoice(root, f, &o.output, "output", "o", "table", "output format", "table", "json", "yaml")
}

// validate checks what flag parsing alone cannot.
func (o *globalOptions) validate() error {
	if o.timeout <= 0 {
		return usageErrorf("--timeout must be positive, got %v", o.timeout)
	}
	return nil
}

// target turns --server into a gRPC target and says whether it is a TCP address.
func (o *globalOptions) target() (target string, tcp bool, err error) {
	s := o.server
	switch {
	case strings.HasPrefix(s, "unix:"):
		if strings.TrimLeft(strings.TrimPrefix(s, "unix:"), "/") == "" {
			return "", false, usageErrorf("--server %q names no socket path", s)
		}
		return s, false, nil
	case strings.HasPrefix(s, "/"):
		return "unix://" + s, false, nil
	case strings.HasPrefix(s, "./"), strings.HasPrefix(s, "../"):
		return "unix:" + s, false, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return "", false, usageErrorf("--server %q is not unix:///path, /path or host:port", s)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return "", false, usageErrorf("--server %q: %q is not a port (1-65535)", s, port)
	}
	return "dns:///" + s, true, nil
}

// dial connects lazily to --server: the first RPC establishes the connection, so an
// unreachable server shows up as that RPC's Unavailable error.
func (o *globalOptions) dial() (*grpc.ClientConn, error) {
	target, tcp, err := o.target()
	if err != nil {
		return nil, err
	}
	anyTLS := o.tlsCert != "" || o.tlsKey != "" || o.tlsCA != "" || o.tlsServerName != ""
	var creds credentials.TransportCredentials
	switch {
	case !tcp && anyTLS:
		return nil, usageErrorf("TLS flags apply only to a TCP --server; %q is a Unix socket", o.server)
	case !tcp:
		// A Unix socket is protected by its file permissions (0600, root): no TLS.
		creds = insecure.NewCredentials()
	case o.tlsCert == "" || o.tlsKey == "":
		return nil, usageErrorf("--server %q is a TCP address, and lbd accepts TCP clients only with mutual TLS: "+
			"give --tls-cert and --tls-key (and --tls-ca for a private CA), or use the Unix socket", o.server)
	default:
		cfg, err := o.tlsConfig()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent("lbctl/"+clientVersion()),
		grpc.WithChainUnaryInterceptor(o.warnStale),
		// A full listing of a large node (16k services × many backends) exceeds gRPC's
		// default 4 MiB receive limit.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes)))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", o.server, err)
	}
	return conn, nil
}

// staleHeader is the response header in which lbd states that its answer comes from a
// copy of its fleet's services that may be behind (the etcd store is unreachable).
const staleHeader = "lbd-stale"

// warnStale notes whether lbd answered, and tells the user, once per command, on stderr, that the answer may be stale.
func (o *globalOptions) warnStale(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var hdr metadata.MD
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&hdr), grpc.Peer(&p))...)
	if p.Addr != nil {
		o.answered = true
	}
	if v := hdr.Get(staleHeader); len(v) > 0 && !o.warned && o.stderr != nil {
		o.warned = true
		fmt.Fprintf(o.stderr, "lbctl: warning: stale: %s\n", v[0])
	}
	return err
}

func (o *globalOptions) tlsConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("load client certificate: %w", err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		ServerName:   o.tlsServerName,
		MinVersion:   tls.VersionTLS12,
	}
	if o.tlsCA != "" {
		pem, err := os.ReadFile(o.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("read CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("read CA bundle: no PEM certificate in %s", o.tlsCA)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// maxResponseBytes bounds one response lbctl accepts.
const maxResponseBytes = 512 << 20
