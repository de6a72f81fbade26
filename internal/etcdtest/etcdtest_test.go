//go:build linux

package etcdtest

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestCluster checks what the fleet tests rely on: a three-member cluster serves
// writes, keeps serving them with one member killed, refuses them with every member
// stopped, and comes back with its data when the members start again.
func TestCluster(t *testing.T) {
	c := Start(t, Options{})
	cli := c.Client()
	put := func(key string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := cli.Put(ctx, key, "v")
		return err
	}
	if err := put("/t/a", 5*time.Second); err != nil {
		t.Fatalf("write to a healthy cluster: %v", err)
	}

	// A killed leader's followers elect another one first: a write may time out
	// meanwhile, then goes through.
	c.Members[0].Kill()
	deadline := time.Now().Add(30 * time.Second)
	for err := put("/t/b", 5*time.Second); err != nil; err = put("/t/b", 5*time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("write with one of three members killed: %v", err)
		}
	}

	c.StopAll()
	if err := put("/t/c", 2*time.Second); err == nil {
		t.Fatal("a write succeeded with every member stopped")
	}

	c.StartStopped(30 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/t/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("read after restart: %v", err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	if len(keys) != 2 || keys[0] != "/t/a" || keys[1] != "/t/b" {
		t.Fatalf("keys after restart: %q, want [/t/a /t/b]", keys)
	}
}

// TestClusterTLS: a cluster with TLS serves a client with a certificate of its CA, and
// refuses one that trusts another CA, and one without a client certificate.
func TestClusterTLS(t *testing.T) {
	c := Start(t, Options{TLS: true})
	if err := c.probe(c.Endpoints(), func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Put(ctx, "/t/tls", "v")
		return err
	}); err != nil {
		t.Fatalf("a client of the cluster's CA: %v", err)
	}
	other := NewCA(t, t.TempDir(), "other-ca")
	for name, cfg := range map[string]*tls.Config{
		"trusting another CA":   other.clientTLS(),
		"without a certificate": {RootCAs: c.clientTLS.RootCAs, MinVersion: tls.VersionTLS12},
	} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: time.Second, Logger: zap.NewNop(), TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = cli.Put(ctx, "/t/tls", "x")
		cancel()
		cli.Close()
		if err == nil {
			t.Errorf("a client %s could write", name)
		}
	}
}
