//go:build linux

package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/api"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// lbctlWatch is an lbctl service list -w running against a daemon.
type lbctlWatch struct {
	mu       sync.Mutex
	out, err bytes.Buffer
}

func (w *lbctlWatch) stdout() string { w.mu.Lock(); defer w.mu.Unlock(); return w.out.String() }
func (w *lbctlWatch) stderr() string { w.mu.Lock(); defer w.mu.Unlock(); return w.err.String() }

// lockedWriter writes into a buffer under a watch's lock.
type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

// startWatch runs lbctl service list -w against a daemon until the test ends, and
// waits until it printed the current services.
func (d *daemon) startWatch(t *testing.T) *lbctlWatch {
	t.Helper()
	w := &lbctlWatch{}
	cmd := exec.Command(d.tb.lbctlBin, "-s", "unix://"+d.sock, "service", "list", "-w")
	cmd.Stdout, cmd.Stderr = lockedWriter{&w.mu, &w.out}, lockedWriter{&w.mu, &w.err}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	eventually(t, 10*time.Second, func() error {
		select {
		case <-exited:
			return fmt.Errorf("lbctl service list -w exited: %q %q", w.stdout(), w.stderr())
		default:
		}
		if !strings.Contains(w.stdout(), "web") {
			return fmt.Errorf("lbctl service list -w printed %q", w.stdout())
		}
		return nil
	})
	return w
}

// TestFleetPartition: the etcd leader killed changes nothing: while the others elect a
// new one and until the killed member is back, connections through every LB node keep
// echoing, new requests are all answered, reads never say stale, a write succeeds as
// soon as a leader exists, and every node programs it. With every member stopped,
// traffic through every LB node goes on unchanged for 60 s, writes are refused with
// UNAVAILABLE, reads and watches say they are stale. Once the members are back, the
// nodes resync, watches say they are current again, and a change made then through one
// node reaches every node.
func TestFleetPartition(t *testing.T) {
	tb := newLB(t, options{lbs: 3, etcd: true})
	lb1, lb3 := tb.lbs[0].lbd, tb.lbs[2].lbd

	// A long-lived connection through each LB node.
	streams := map[*node]*stream{}
	for range 60 {
		if len(streams) == len(tb.lbs) {
			break
		}
		s := tb.openStream(t, streamVIP)
		if err := s.progress(5, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if from, _ := tb.carrier(t, s.local); streams[from] == nil {
			streams[from] = s
		} else {
			s.close()
		}
	}
	if len(streams) != len(tb.lbs) {
		t.Fatalf("60 connections went through %d of %d LB nodes", len(streams), len(tb.lbs))
	}

	t.Run("leader killed", func(t *testing.T) {
		newFlows := map[string]uint64{}
		for _, lb := range tb.lbs {
			newFlows[lb.name] = lb.lbd.serviceStats(t, "web").GetNewFlows()
		}
		// New requests and reads of every node, from before the kill until the
		// killed member is back.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var reqs, reqFails, staleReads, reads int
		var slowest time.Duration
		var problems []string
		var mu sync.Mutex
		note := func(f string, a ...any) {
			mu.Lock()
			defer mu.Unlock()
			if len(problems) < 10 {
				problems = append(problems, fmt.Sprintf(f, a...))
			}
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				began := time.Now()
				_, err := tb.get(webVIP)
				mu.Lock()
				reqs++
				slowest = max(slowest, time.Since(began))
				if err != nil {
					reqFails++
				}
				mu.Unlock()
				if err != nil {
					note("request %d: %v", reqs, err)
				}
			}
		})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				for _, lb := range tb.lbs {
					r, err := lb.lbd.stale()
					mu.Lock()
					reads++
					if r != "" {
						staleReads++
					}
					mu.Unlock()
					if err != nil || r != "" {
						note("read on %s: %v, stale: %q", lb.name, err, r)
					}
				}
			}
		})
		lead := tb.etcd.WaitLeader(10 * time.Second)
		lead.Kill()
		killed := time.Now()
		next := tb.etcd.WaitLeader(30 * time.Second)
		elected := time.Since(killed)
		// A write through the API succeeds at the first attempt once a leader exists.
		lb1.lbctl(t, "backend", "set-weight", "web", netip.AddrPortFrom(tb.backends[0].addr4, httpPort).String(), "3")
		written := time.Since(killed)
		tb.waitService(t, "web", func(svc *lbdv1.Service) error {
			if w := svc.GetBackends()[0].GetWeight(); w != 3 || svc.GetStatus().GetState() != lbdv1.ServiceState_SERVICE_STATE_READY {
				return fmt.Errorf("weight %d, %v, with the leader killed", w, svc.GetStatus().GetState())
			}
			return nil
		})
		converged := time.Since(killed)
		// Past the killed member's lease time and the watches' leader checks.
		for time.Since(killed) < 12*time.Second {
			for from, s := range streams {
				if err := s.progress(20, 10*time.Second); err != nil {
					t.Fatalf("through %s with the leader killed: %v", from.name, err)
				}
			}
		}
		lead.Start()
		tb.etcd.WaitHealthy(30 * time.Second)
		close(stop)
		wg.Wait()
		for _, lb := range tb.lbs {
			if n := lb.lbd.serviceStats(t, "web").GetNewFlows(); n == newFlows[lb.name] {
				t.Errorf("%s carried no new flow while the leader was killed", lb.name)
			}
		}
		t.Logf("leader %s killed: %s elected after %v; a write through lb1 succeeded after %v, in every node's maps after %v; "+
			"%d requests (%d failed, slowest %v), %d reads (%d stale), member back after %v",
			lead.Name, next.Name, elected.Round(time.Millisecond), written.Round(time.Millisecond), converged.Round(time.Millisecond),
			reqs, reqFails, slowest.Round(time.Millisecond), reads, staleReads, time.Since(killed).Round(time.Millisecond))
		if reqFails > 0 || staleReads > 0 || len(problems) > 0 {
			t.Fatalf("with the etcd leader killed: %d of %d requests failed, %d of %d reads stale:\n%s",
				reqFails, reqs, staleReads, reads, strings.Join(problems, "\n"))
		}
	})

	before := map[string]string{}
	for _, lb := range tb.lbs {
		before[lb.name] = lb.lbd.staleHeader(t)
		if before[lb.name] != "" {
			t.Fatalf("%s states staleness with etcd up: %s", lb.name, before[lb.name])
		}
	}
	watch := lb1.startWatch(t)

	tb.etcd.StopAll()
	outage := time.Now()
	for _, lb := range tb.lbs {
		eventually(t, 20*time.Second, func() error {
			if lb.lbd.staleHeader(t) == "" {
				return fmt.Errorf("%s: reads do not say stale with every etcd member stopped", lb.name)
			}
			return nil
		})
	}
	t.Logf("reads on lb1 say: %s", lb1.staleHeader(t))
	eventually(t, 10*time.Second, func() error {
		if !strings.Contains(watch.stderr(), "lbctl: warning: stale: etcd unreachable since") {
			return fmt.Errorf("lbctl service list -w on lb1 has not warned: %q", watch.stderr())
		}
		return nil
	})
	lb3.checkStaleWatch(t)
	code, _, errOut := tb.lbctlCode(t, "-s", "unix://"+lb1.sock, "service", "create", "new", "--vip", "203.0.113.21",
		"--port", "80", "--backend", netip.AddrPortFrom(tb.backends[0].addr4, httpPort).String())
	if code == 0 || !strings.Contains(errOut, "etcd store is unreachable") || !strings.Contains(errOut, "code: Unavailable") ||
		!strings.Contains(errOut, "warning: stale") || strings.Contains(errOut, "cannot reach lbd") {
		t.Fatalf("a write with etcd down: exit %d, %s", code, errOut)
	}
	t.Logf("a write with etcd down: %s", strings.TrimSpace(errOut))
	// The datapath keeps forwarding: every node's connection progresses, new
	// connections are balanced, for 60 s.
	for time.Since(outage) < 60*time.Second {
		for from, s := range streams {
			if err := s.progress(20, 10*time.Second); err != nil {
				t.Fatalf("through %s with etcd down for %v: %v", from.name, time.Since(outage).Round(time.Second), err)
			}
		}
		if hs := tb.getMany(t, webVIP, 10); len(hs) != 10 {
			t.Fatalf("with etcd down: %d of 10 requests answered", len(hs))
		}
		time.Sleep(time.Second)
	}
	if _, err := lb3.serviceOn("new"); status.Code(err) != codes.NotFound {
		t.Fatalf("the refused service exists on lb3: %v", err)
	}

	tb.etcd.StartStopped(60 * time.Second)
	back := time.Now()
	for _, lb := range tb.lbs {
		eventually(t, 30*time.Second, func() error {
			if r := lb.lbd.staleHeader(t); r != "" {
				return fmt.Errorf("%s still stale with etcd back: %s", lb.name, r)
			}
			return nil
		})
	}
	t.Logf("every LB node in step again %v after the cluster was healthy", time.Since(back).Round(time.Millisecond))
	eventually(t, 10*time.Second, func() error {
		if !strings.Contains(watch.stderr(), "lbctl: no longer stale") {
			return fmt.Errorf("lbctl service list -w on lb1 has not said it is current again: %q", watch.stderr())
		}
		return nil
	})
	eventually(t, 30*time.Second, func() error {
		_, err := lb3.lb.CreateService(context.Background(), &lbdv1.CreateServiceRequest{Service: &lbdv1.Service{
			Name: "after", Vip: "203.0.113.22", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
			Backends: []*lbdv1.Backend{{Address: tb.backends[1].addr4.String(), Port: httpPort}}}})
		return err
	})
	tb.waitServiceReady(t, "after")
	eventually(t, 10*time.Second, func() error {
		if !strings.Contains(watch.stdout(), "after") {
			return fmt.Errorf("lbctl service list -w on lb1 has not printed the service created on lb3: %q", watch.stdout())
		}
		return nil
	})
	t.Logf("lbctl service list -w on lb1 through the outage, on stderr:\n%s", watch.stderr())
	for from, s := range streams {
		if err := s.progress(20, 10*time.Second); err != nil {
			t.Fatalf("through %s after etcd came back: %v", from.name, err)
		}
	}
}

// waitServiceReady waits until every LB node programmed a service.
func (tb *testbed) waitServiceReady(t *testing.T, name string) {
	t.Helper()
	tb.waitService(t, name, func(svc *lbdv1.Service) error {
		if st := svc.GetStatus().GetState(); st != lbdv1.ServiceState_SERVICE_STATE_READY {
			return fmt.Errorf("state %v: %s", st, svc.GetStatus().GetReason())
		}
		return nil
	})
}

// checkStaleWatch opens a watch of a stale daemon's services: the stream's header and
// every event up to SYNCED say so, as the unary reads do.
func (d *daemon) checkStaleWatch(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := d.lb.WatchServices(ctx, &lbdv1.WatchServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := stream.Header()
	if err != nil || len(hdr.Get(api.StaleHeader)) == 0 {
		t.Fatalf("%s: a watch's header with etcd down: %v, %v", d.node.name, hdr, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: watch with etcd down: %v", d.node.name, err)
		}
		if !strings.Contains(ev.GetStaleReason(), "etcd unreachable since") {
			t.Fatalf("%s: a watch event with etcd down: %v", d.node.name, ev)
		}
		if ev.Type == lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
			return
		}
	}
}
