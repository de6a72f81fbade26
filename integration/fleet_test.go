//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/internal/etcdtest"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// The fleet tests run the LB daemons on the etcd store: one etcd member in each LB
// node's namespace, on the node's fabric address (a small fleet can run them there, as
// docs/deploy-fleet.md says), every daemon with the whole cluster as its endpoints.

// startEtcd starts the cluster of options.etcd, before the daemons.
func (tb *testbed) startEtcd() {
	var nss []*testnet.NS
	var addrs []netip.Addr
	for _, lb := range tb.lbs {
		nss = append(nss, lb.ns)
		addrs = append(addrs, lb.addr4)
	}
	tb.etcd = etcdtest.Start(tb.t, etcdtest.Options{Namespaces: nss, Addrs: addrs, Dir: tb.dir})
}

// storeConfig is the store section of an LB daemon on the etcd store.
func (d *daemon) storeConfig() string {
	eps := make([]string, 0, len(d.tb.etcd.Members))
	for _, m := range d.tb.etcd.Members {
		eps = append(eps, m.ClientURL)
	}
	return fmt.Sprintf("store: {type: etcd, endpoints: [%s], prefix: /lbd/it-%s/, node_name: %s, timeout: 2s}\n",
		strings.Join(eps, ", "), d.tb.sfx, d.node.name)
}

// waitFleet waits until a daemon on the etcd store has read the fleet: until then it
// serves its local copy and takes no change.
func (d *daemon) waitFleet(t *testing.T) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		if r := d.staleHeader(t); r != "" {
			return fmt.Errorf("%s: %s", d.node.name, r)
		}
		return nil
	})
}

// serviceOn reads a service through a daemon's API.
func (d *daemon) serviceOn(name string) (*lbdv1.Service, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := d.lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: name})
	return resp.GetService(), err
}

// programmed reports whether a daemon's datapath holds revision rev (or a later one)
// of a service: the service is READY only once the datapath applied its last change.
func (d *daemon) programmed(name string, rev uint64) (bool, error) {
	svc, err := d.serviceOn(name)
	if err != nil {
		return false, err
	}
	return svc.GetRevision() >= rev && svc.GetStatus().GetState() == lbdv1.ServiceState_SERVICE_STATE_READY, nil
}

// percentile of sorted durations.
func percentile(d []time.Duration, p float64) time.Duration {
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// TestFleetEtcd: three LB nodes share their services through a three-member etcd
// cluster. The default services were created through lb1's API only. A change through
// lb1's API reaches lb3's maps (the time of 100 changes is reported); a connection
// carried by lb1 survives lb1's withdrawal onto lb2, whose table was built from the
// fleet's services; two nodes editing the same backend at once lose neither edit
// (the loser of the compare-and-swap gets ABORTED and retries).
func TestFleetEtcd(t *testing.T) {
	// No verification pass may repair the entry the divergence test plants.
	tb := newLB(t, options{lbs: 3, etcd: true, verifyInterval: time.Hour})
	lb1, lb2, lb3 := tb.lbs[0].lbd, tb.lbs[1].lbd, tb.lbs[2].lbd

	t.Run("propagation", func(t *testing.T) {
		be := tb.backends[0].addr4
		lb1.lbctl(t, "service", "create", "prop", "--vip", "203.0.113.20", "--port", "80",
			"--backend", netip.AddrPortFrom(be, httpPort).String())
		var lat []time.Duration
		for i := range 100 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := lb1.lb.UpdateBackend(ctx, &lbdv1.UpdateBackendRequest{ServiceName: "prop",
				Backend:    &lbdv1.Backend{Address: be.String(), Port: httpPort, Weight: uint32(i%50 + 2)},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"weight"}}})
			cancel()
			if err != nil {
				t.Fatalf("change %d through lb1: %v", i, err)
			}
			done := time.Now()
			svc, err := lb1.serviceOn("prop")
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetBackend().GetWeight() != uint32(i%50+2) {
				t.Fatalf("change %d: weight %d", i, resp.GetBackend().GetWeight())
			}
			rev := svc.GetRevision()
			deadline := done.Add(30 * time.Second)
			for {
				ok, err := lb3.programmed("prop", rev)
				if err == nil && ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("change %d (revision %d) not in lb3's maps after 30s: %v", i, rev, err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			lat = append(lat, time.Since(done))
		}
		slices.Sort(lat)
		t.Logf("a change through lb1's API in lb3's maps, 100 changes: p50 %v, p90 %v, p99 %v, max %v (min %v)",
			percentile(lat, 0.5), percentile(lat, 0.9), percentile(lat, 0.99), lat[len(lat)-1], lat[0])
		tb.waitService(t, "prop", func(svc *lbdv1.Service) error {
			if w := svc.GetBackends()[0].GetWeight(); w != 99%50+2 {
				return fmt.Errorf("weight %d", w)
			}
			return nil
		})
	})

	t.Run("divergence", func(t *testing.T) {
		// A change shows as a difference until every node registered its digests again.
		eventually(t, 10*time.Second, func() error {
			if code, r := fleetStatus(t, lb1); code != 0 || len(r.Nodes) != 3 || len(r.Diverged) != 0 {
				return fmt.Errorf("fleet status of agreeing nodes: exit %d, %d nodes, diverged %q", code, len(r.Nodes), divergedNames(r))
			}
			return nil
		})
		plantBackendPort(t, lb2, "web", 1)
		planted := time.Now()
		eventually(t, 10*time.Second, func() error {
			code, r := fleetStatus(t, lb1)
			if code != 1 || divergedNames(r) != "web" {
				return fmt.Errorf("fleet status on lb1: exit %d, diverged %q", code, divergedNames(r))
			}
			if n := parseMetrics(t, lb3.scrape(t))["lbd_fleet_diverged_services"]; n != 1 {
				return fmt.Errorf("lbd_fleet_diverged_services on lb3 is %v", n)
			}
			return nil
		})
		t.Logf("a backend entry rewritten in lb2's map: in lb1's fleet status and lb3's metric after %v", time.Since(planted).Round(time.Millisecond))
		lb2.lbctl(t, "node", "verify")
		eventually(t, 10*time.Second, func() error {
			if code, r := fleetStatus(t, lb1); code != 0 || len(r.Diverged) != 0 {
				return fmt.Errorf("after lbctl node verify on lb2: exit %d, diverged %q", code, divergedNames(r))
			}
			return nil
		})
	})

	t.Run("withdrawal", func(t *testing.T) {
		var s *stream
		var backend string
		for range 40 {
			c := tb.openStream(t, streamVIP)
			if err := c.progress(5, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			from, b := tb.carrier(t, c.local)
			if from == tb.lbs[0] {
				s, backend = c, b
				break
			}
			c.close()
		}
		if s == nil {
			t.Fatal("40 connections: none went through lb1")
		}
		t.Logf("stream from %v through lb1 to %s; withdrawing lb1 from the router", s.local, backend)
		tb.router.setNextHops(t, tb.lbs[1])
		if err := s.progress(100, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := lb2.flowBackend(t, s.local); got != backend {
			t.Fatalf("lb2's conntrack has the flow on backend %q, want %s", got, backend)
		}
		s.close()
		tb.router.setNextHops(t, tb.lbs...)
	})

	t.Run("concurrent edits", func(t *testing.T) {
		be := netip.AddrPortFrom(tb.backends[1].addr4, echoPort)
		aborted := 0
		var mu sync.Mutex
		edit := func(d *daemon, b *lbdv1.Backend, paths ...string) error {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := d.lb.UpdateBackend(ctx, &lbdv1.UpdateBackendRequest{ServiceName: "stream", Backend: b,
					UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}})
				cancel()
				if status.Code(err) != codes.Aborted {
					return err
				}
				mu.Lock()
				aborted++
				mu.Unlock()
			}
		}
		for round := range 20 {
			weight := uint32(round + 2)
			state := lbdv1.BackendState_BACKEND_STATE_DRAINING
			if round%2 == 1 {
				state = lbdv1.BackendState_BACKEND_STATE_ACTIVE
			}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			wg.Go(func() {
				errs[0] = edit(lb1, &lbdv1.Backend{Address: be.Addr().String(), Port: uint32(be.Port()), Weight: weight}, "weight")
			})
			wg.Go(func() {
				errs[1] = edit(lb2, &lbdv1.Backend{Address: be.Addr().String(), Port: uint32(be.Port()), State: state}, "state")
			})
			wg.Wait()
			if errs[0] != nil || errs[1] != nil {
				t.Fatalf("round %d: %v, %v", round, errs[0], errs[1])
			}
			tb.waitService(t, "stream", func(svc *lbdv1.Service) error {
				for _, b := range svc.GetBackends() {
					if b.GetAddress() == be.Addr().String() && b.GetPort() == uint32(be.Port()) {
						if b.GetWeight() != weight || b.GetState() != state {
							return fmt.Errorf("round %d: weight %d state %v, want %d %v (an edit was lost)", round, b.GetWeight(), b.GetState(), weight, state)
						}
						return nil
					}
				}
				return fmt.Errorf("no backend %v", be)
			})
		}
		t.Logf("20 rounds of two nodes editing one backend at once: %d ABORTED answers, retried; no edit lost", aborted)
	})
}

// fleetStatus runs lbctl fleet status against a daemon.
func fleetStatus(t *testing.T, d *daemon) (int, *lbdv1.GetFleetResponse) {
	t.Helper()
	code, out, errOut := d.tb.lbctlCode(t, "-s", "unix://"+d.sock, "-o", "json", "fleet", "status")
	r := &lbdv1.GetFleetResponse{}
	if err := protojson.Unmarshal([]byte(out), r); err != nil {
		t.Fatalf("lbctl fleet status: exit %d, %v: %s %s", code, err, out, errOut)
	}
	return code, r
}

// staleHeader calls ListServices on a daemon and returns the staleness it states.
func (d *daemon) staleHeader(t *testing.T) string {
	t.Helper()
	var hdr metadata.MD
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.lb.ListServices(ctx, &lbdv1.ListServicesRequest{}, grpc.Header(&hdr)); err != nil {
		t.Fatalf("%s: list services: %v", d.node.name, err)
	}
	return strings.Join(hdr.Get(api.StaleHeader), " ")
}

// TestFleetPartition: one etcd member killed changes nothing. With every member
// stopped, traffic through every LB node goes on unchanged for 60 s, writes are refused
// with UNAVAILABLE and reads say they are stale. Once the members are back, the nodes
// resync, and a change made then through one node reaches every node.
func TestFleetPartition(t *testing.T) {
	tb := newLB(t, options{lbs: 3, etcd: true})
	lb1, lb3 := tb.lbs[0].lbd, tb.lbs[2].lbd

	tb.etcd.Members[2].Kill()
	// Had it led, the others elect a new leader first.
	tb.etcd.WaitHealthy(30 * time.Second)
	lb1.lbctl(t, "backend", "set-weight", "web", netip.AddrPortFrom(tb.backends[0].addr4, httpPort).String(), "3")
	tb.waitService(t, "web", func(svc *lbdv1.Service) error {
		if w := svc.GetBackends()[0].GetWeight(); w != 3 {
			return fmt.Errorf("weight %d with one member killed", w)
		}
		return nil
	})
	tb.etcd.Members[2].Start()
	tb.etcd.WaitHealthy(30 * time.Second)

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
	before := map[string]string{}
	for _, lb := range tb.lbs {
		before[lb.name] = lb.lbd.staleHeader(t)
		if before[lb.name] != "" {
			t.Fatalf("%s states staleness with etcd up: %s", lb.name, before[lb.name])
		}
	}

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
	eventually(t, 30*time.Second, func() error {
		_, err := lb3.lb.CreateService(context.Background(), &lbdv1.CreateServiceRequest{Service: &lbdv1.Service{
			Name: "after", Vip: "203.0.113.22", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP,
			Backends: []*lbdv1.Backend{{Address: tb.backends[1].addr4.String(), Port: httpPort}}}})
		return err
	})
	tb.waitServiceReady(t, "after")
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
