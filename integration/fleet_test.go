//go:build linux

package integration

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// The fleet tests run the LB daemons on the etcd store: one etcd member in each LB
// node's namespace, on the node's fabric address (a small fleet can run them there, as
// docs/deploy-fleet.md says), every daemon with the whole cluster as its endpoints.
// Members and daemons use TLS as that guide sets it up: certificates of one CA, client
// certificates required.

// startEtcd starts the cluster of options.etcd, before the daemons.
func (tb *testbed) startEtcd() {
	var nss []*testnet.NS
	var addrs []netip.Addr
	for _, lb := range tb.lbs {
		nss = append(nss, lb.ns)
		addrs = append(addrs, lb.addr4)
	}
	tb.etcd = etcdtest.Start(tb.t, etcdtest.Options{Namespaces: nss, Addrs: addrs, Dir: tb.dir, TLS: true})
}

// storeConfig is the store section of an LB daemon on the etcd store, as
// docs/deploy-fleet.md writes it; caFile replaces the CA the members' certificates
// come from when set.
func (d *daemon) storeConfig(caFile string) string {
	eps := make([]string, 0, len(d.tb.etcd.Members))
	for _, m := range d.tb.etcd.Members {
		eps = append(eps, m.ClientURL)
	}
	if caFile == "" {
		caFile = d.tb.etcd.CA.File
	}
	cert, key := d.tb.etcd.CA.Issue(d.node.name)
	return fmt.Sprintf(`store:
  type: etcd
  endpoints: [%s]
  prefix: /lbd/it-%s/
  node_name: %s
  timeout: 2s
  tls:
    ca_file: %s
    cert_file: %s
    key_file: %s
`, strings.Join(eps, ", "), d.tb.sfx, d.node.name, caFile, cert, key)
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

	t.Run("services files", func(t *testing.T) {
		before := tb.fleetServices(t, lb3)
		revBefore := lb3.fleetRevision(t)
		// What one node exports, applied through another, changes nothing anywhere.
		code, out, errOut := tb.shell(t, "", fmt.Sprintf("set -o pipefail; %[1]s -s unix://%[2]s export | %[1]s -s unix://%[3]s -o json apply -f -",
			tb.lbctlBin, lb1.sock, lb2.sock))
		if r := applyAnswer(t, code, out, errOut); r.Created+r.Updated+r.Deleted != 0 || len(r.Changes) != 0 || r.Unchanged != uint32(len(before)) {
			t.Fatalf("lbctl export | lbctl apply -f -: %v", r)
		}
		if after := tb.fleetServices(t, lb3); !maps.EqualFunc(before, after, func(a, b *lbdv1.Service) bool { return proto.Equal(a, b) }) {
			t.Fatalf("lbctl export | lbctl apply -f - changed services: before %v, after %v", before, after)
		}
		if rev := lb3.fleetRevision(t); rev != revBefore {
			t.Fatalf("lbctl export | lbctl apply -f - wrote to etcd: the fleet's revision went from %d to %d", revBefore, rev)
		}

		// An edited file: one service removed, one added, one backend's weight changed.
		_, exported, _ := tb.lbctlCode(t, "-s", "unix://"+lb1.sock, "export")
		file := editServicesFile(t, exported)
		code, out, errOut = tb.shell(t, file, fmt.Sprintf("%s -s unix://%s -o json diff -f -", tb.lbctlBin, lb2.sock))
		diff := applyAnswer(t, code, out, errOut)
		if rev := lb3.fleetRevision(t); rev != revBefore {
			t.Fatalf("lbctl diff -f wrote to etcd: the fleet's revision went from %d to %d", revBefore, rev)
		}
		code, out, errOut = tb.shell(t, file, fmt.Sprintf("%s -s unix://%s -o json apply -f -", tb.lbctlBin, lb1.sock))
		applied := applyAnswer(t, code, out, errOut)
		if diff.Created != 1 || diff.Updated != 1 || diff.Deleted != 1 || len(diff.Changes) != 3 {
			t.Fatalf("lbctl diff -f of a file with one service added, removed and changed each: %v", diff)
		}
		if len(diff.Changes) != len(applied.Changes) {
			t.Fatalf("diff listed %d changes, apply made %d", len(diff.Changes), len(applied.Changes))
		}
		for i, d := range diff.Changes {
			if a := applied.Changes[i]; d.Name != a.Name || d.Type != a.Type || !sameSpec(d.After, a.After) || !sameSpec(d.Before, a.Before) {
				t.Fatalf("change %d: diff listed %v, apply made %v", i, d, a)
			}
		}
		// The changes apply made are the changes every node has: another node's
		// services differ from before in exactly those.
		tb.waitServiceReady(t, "filed")
		after := tb.fleetServices(t, lb3)
		seen := map[string]bool{}
		for _, c := range applied.Changes {
			seen[c.Name] = true
			switch b, a := before[c.Name], after[c.Name]; c.Type {
			case lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_CREATED:
				if b != nil || !sameSpec(a, c.After) {
					t.Errorf("%s created: on lb3 before %v, after %v; want %v", c.Name, b, a, c.After)
				}
			case lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_DELETED:
				if b == nil || a != nil {
					t.Errorf("%s deleted: on lb3 before %v, after %v", c.Name, b, a)
				}
			case lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_UPDATED:
				if b == nil || a == nil || a.Revision == b.Revision || !sameSpec(a, c.After) || !sameSpec(b, c.Before) {
					t.Errorf("%s updated: on lb3 before %v, after %v; want %v then %v", c.Name, b, a, c.Before, c.After)
				}
			}
		}
		for name, b := range before {
			if !seen[name] && !proto.Equal(b, after[name]) {
				t.Errorf("%s is in no change, but lb3 has %v, had %v", name, after[name], b)
			}
		}
		t.Logf("lbctl diff -f listed, and apply -f made: %s", changeNames(applied.Changes))
	})

	t.Run("node given another service", func(t *testing.T) {
		testnet.Require(t, "nft")
		// The one way a node can hold a service its fleet lacks: its copy changed
		// while it was off the etcd store (moved back to the file store, a service
		// created there), and it comes back to the etcd store cut off from etcd.
		lb2.stop(t)
		lb2.fileStore = true
		lb2.start(t)
		lb2.lbctl(t, "service", "create", "rogue", "--vip", "203.0.113.24", "--port", "80",
			"--backend", netip.AddrPortFrom(tb.backends[0].addr4, httpPort).String())
		lb2.stop(t)
		lb2.node.ns.Exec(t, "nft", "add table inet lbdit; add chain inet lbdit out { type filter hook output priority 0; }; add rule inet lbdit out tcp dport 2379 drop")
		lb2.fileStore = false
		lb2.start(t)
		// Cut off for longer than it takes to reach etcd and read the fleet (a
		// request's timeout, 2 s here, and the probe's second), lb2 keeps its copy
		// and says so.
		for cut := time.Now(); time.Since(cut) < 4*time.Second; time.Sleep(200 * time.Millisecond) {
			if r := lb2.staleHeader(t); !strings.Contains(r, "this is the node's local copy") {
				t.Fatalf("lb2 started cut off from etcd: reads say %q", r)
			}
			if _, err := lb2.serviceOn("rogue"); err != nil {
				t.Fatalf("lb2 started cut off from etcd serves no rogue: %v", err)
			}
		}
		if n := parseMetrics(t, lb2.scrape(t))["lbd_fleet_stale"]; n != 1 {
			t.Fatalf("lb2 started cut off from etcd: lbd_fleet_stale %v", n)
		}
		// The fleet cannot see lb2 (it cannot register), nor take its service.
		eventually(t, 15*time.Second, func() error {
			if _, r := fleetStatus(t, lb1); len(r.Nodes) != 2 {
				return fmt.Errorf("lb1's fleet status lists %d nodes, want lb2 left out", len(r.Nodes))
			}
			return nil
		})
		lb2.node.ns.Exec(t, "nft", "delete table inet lbdit")
		reached := time.Now()
		var sawRogue bool
		eventually(t, 10*time.Second, func() error {
			for _, d := range []*daemon{lb1, lb3} {
				if _, err := d.serviceOn("rogue"); status.Code(err) != codes.NotFound {
					t.Fatalf("%s has lb2's rogue service: %v", d.node.name, err)
				}
			}
			code, r := fleetStatus(t, lb1)
			sawRogue = sawRogue || strings.Contains(divergedNames(r), "rogue")
			if _, err := lb2.serviceOn("rogue"); status.Code(err) != codes.NotFound {
				return fmt.Errorf("lb2 still serves rogue: %v", err)
			}
			if code != 0 || len(r.Nodes) != 3 || len(r.Diverged) != 0 {
				return fmt.Errorf("lb1's fleet status: exit %d, %d nodes, diverged %q", code, len(r.Nodes), divergedNames(r))
			}
			return nil
		})
		t.Logf("lb2 reached etcd: its rogue service gone and the fleet agreeing after %v (rogue listed as diverged meanwhile: %v)",
			time.Since(reached).Round(time.Millisecond), sawRogue)
		if r := lb2.staleHeader(t); r != "" {
			t.Fatalf("lb2 in touch with etcd says it is stale: %s", r)
		}
	})

	t.Run("wrong CA", func(t *testing.T) {
		// lb3 restarted trusting another CA than the members' certificates come from.
		other := etcdtest.NewCA(t, filepath.Join(tb.dir, "other-ca"), "other-ca")
		lb3.stop(t)
		lb3.etcdCA = other.File
		lb3.start(t)
		const want = "certificate signed by unknown authority"
		eventually(t, 20*time.Second, func() error {
			if r := lb3.staleHeader(t); !strings.Contains(r, want) {
				return fmt.Errorf("reads on lb3 say %q, want the reason %q", r, want)
			}
			return nil
		})
		code, _, errOut := tb.lbctlCode(t, "-s", "unix://"+lb3.sock, "backend", "set-weight", "web",
			netip.AddrPortFrom(tb.backends[0].addr4, httpPort).String(), "9")
		if code == 0 || !strings.Contains(errOut, "code: Unavailable") || !strings.Contains(errOut, want) {
			t.Fatalf("a write on lb3 trusting another CA: exit %d, %s", code, errOut)
		}
		t.Logf("a write on lb3 trusting another CA: %s", strings.TrimSpace(errOut))
		eventually(t, 15*time.Second, func() error {
			if _, r := fleetStatus(t, lb1); len(r.Nodes) != 2 {
				return fmt.Errorf("lb1's fleet status lists %d nodes, want lb3 left out", len(r.Nodes))
			}
			return nil
		})
		lb3.stop(t)
		lb3.etcdCA = ""
		lb3.start(t)
		lb3.waitFleet(t)
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
	r, err := d.stale()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stale calls ListServices on a daemon and returns the staleness it states.
func (d *daemon) stale() (string, error) {
	var hdr metadata.MD
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.lb.ListServices(ctx, &lbdv1.ListServicesRequest{}, grpc.Header(&hdr)); err != nil {
		return "", fmt.Errorf("%s: list services: %w", d.node.name, err)
	}
	return strings.Join(hdr.Get(api.StaleHeader), " "), nil
}
