package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// diagnoseTimeout bounds the connection attempts that find out why etcd did not
// answer.
const diagnoseTimeout = time.Second

// ErrNoLeader: etcd did not answer, but a quorum of its members do: they have no
// leader (they are electing one), so no change can be made in the fleet meanwhile, and
// what this node holds is not behind. It wraps ErrUnavailable.
var ErrNoLeader = fmt.Errorf("%w: its members answer but have no leader", ErrUnavailable)

// unreachable wraps a failed request like unavailable. When the request only timed out
// or found no connection or leader (the etcd client retries until its deadline and
// keeps the cause to itself), it asks every member for its status: if a quorum answers,
// the error wraps ErrNoLeader; otherwise it adds why the endpoints cannot be reached, as
// far as a connection to each of them tells: refused, timed out, a certificate that
// does not verify or that the members refuse.
func (c *Client) unreachable(op string, err error) error {
	var coded interface{ Code() codes.Code }
	code := status.Code(err)
	if errors.As(err, &coded) {
		code = coded.Code()
	}
	if !errors.Is(err, context.DeadlineExceeded) && code != codes.DeadlineExceeded && code != codes.Unavailable {
		return unavailable(op, err)
	}
	if n := c.answering(); n > len(c.endpoints)/2 {
		return fmt.Errorf("%s: %w (%d of %d members answer): %w", op, ErrNoLeader, n, len(c.endpoints), err)
	}
	if why := c.diagnose(); why != "" {
		err = fmt.Errorf("%w (%s)", err, why)
	}
	return unavailable(op, err)
}

// answering counts the endpoints whose member answers a status request.
func (c *Client) answering() int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	n := 0
	for _, ep := range c.endpoints {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), diagnoseTimeout)
			defer cancel()
			if _, err := c.cli.Status(ctx, ep); err == nil {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return n
}

// diagnose connects to every endpoint, with TLS when the client uses it, and lists the
// failures.
func (c *Client) diagnose() string {
	var mu sync.Mutex
	var fails []string
	var wg sync.WaitGroup
	for _, ep := range c.endpoints {
		wg.Go(func() {
			if err := c.dialEndpoint(ep); err != nil {
				mu.Lock()
				fails = append(fails, fmt.Sprintf("%s: %v", ep, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return strings.Join(fails, "; ")
}

// dialEndpoint connects to one endpoint and completes a TLS handshake; a member that
// refuses the client's certificate says so in an alert right after it, which a short
// read catches (a member that accepted it waits for the client to speak first).
func (c *Client) dialEndpoint(ep string) error {
	u, err := url.Parse(ep)
	if err != nil || u.Host == "" {
		return fmt.Errorf("not a URL: %q", ep)
	}
	d := &net.Dialer{Timeout: diagnoseTimeout}
	conn, err := d.Dial("tcp", u.Host)
	if err != nil {
		return err
	}
	defer conn.Close()
	if c.tls == nil || u.Scheme != "https" {
		return nil
	}
	cfg := c.tls.Clone()
	cfg.ServerName = u.Hostname()
	cfg.NextProtos = []string{"h2"}
	tc := tls.Client(conn, cfg)
	tc.SetDeadline(time.Now().Add(diagnoseTimeout))
	if err := tc.Handshake(); err != nil {
		return err
	}
	tc.SetReadDeadline(time.Now().Add(diagnoseTimeout / 4))
	if _, err := tc.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		var alert tls.AlertError
		if errors.As(err, &alert) || strings.Contains(err.Error(), "remote error") {
			return err
		}
	}
	return nil
}
