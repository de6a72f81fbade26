package healthsync

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

const (
	up   = lbdv1.HealthState_HEALTH_STATE_UP
	down = lbdv1.HealthState_HEALTH_STATE_DOWN
	none = lbdv1.HealthState_HEALTH_STATE_UNSPECIFIED
)

// A backend whose server stops is marked down in the store, leaves the usable count and
// reaches the datapath as down; it comes back when its server does.
func TestBackendDownAndBackUpReachesStoreAndDatapath(t *testing.T) {
	st := openStore(t)
	fake := runReconciler(t, st)
	a, b := newBackendServer(t), newBackendServer(t)
	svc := create(t, st, service("web", "203.0.113.10", httpCheck("/healthz"),
		a.backend("198.18.0.10"), b.backend("198.18.0.11")))
	run(t, st, Options{})

	waitHealth(t, st, "web", "198.18.0.10", up)
	got := waitHealth(t, st, "web", "198.18.0.11", up)
	if h := backendOf(got, "198.18.0.10").Health; h.LastResult != "ok: HTTP 200" ||
		h.LastCheckTime == nil || h.LastTransitionTime == nil {
		t.Errorf("health of an up backend: %v", h)
	}

	a.stop()
	got = waitHealth(t, st, "web", "198.18.0.10", down)
	h := backendOf(got, "198.18.0.10").Health
	if !strings.Contains(h.LastResult, "connection refused") {
		t.Errorf("last_result %q does not say why the probe failed", h.LastResult)
	}
	if h.LastCheckTime.AsTime().Before(h.LastTransitionTime.AsTime().Add(-testInterval)) {
		t.Errorf("last check %v is not the check behind the transition at %v",
			h.LastCheckTime.AsTime(), h.LastTransitionTime.AsTime())
	}
	if backendOf(got, "198.18.0.11").Health.State != up {
		t.Errorf("the other backend is %v", backendOf(got, "198.18.0.11").Health.State)
	}
	eventually(t, "status counting one usable backend", func() bool {
		s, err := st.GetService("web")
		return err == nil && s.Status.UsableBackends == 1 &&
			s.Status.State == lbdv1.ServiceState_SERVICE_STATE_READY &&
			s.Status.Reason == "1 of 2 backends usable"
	})
	eventually(t, "datapath programmed with the backend down", func() bool {
		p := fake.Services()[svc.Id]
		return backendOf(p, "198.18.0.10").GetHealth().GetState() == down &&
			backendOf(p, "198.18.0.11").GetHealth().GetState() == up
	})

	b.stop()
	waitHealth(t, st, "web", "198.18.0.11", down)
	eventually(t, "status saying no backend is usable because both are down", func() bool {
		s, err := st.GetService("web")
		return err == nil && s.Status.UsableBackends == 0 &&
			s.Status.State == lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS &&
			strings.Contains(s.Status.Reason, "2 down")
	})

	a.start()
	b.start()
	waitHealth(t, st, "web", "198.18.0.10", up)
	waitHealth(t, st, "web", "198.18.0.11", up)
	eventually(t, "status with both backends usable again", func() bool {
		s, err := st.GetService("web")
		return err == nil && s.Status.UsableBackends == 2
	})
	eventually(t, "datapath programmed with both backends up", func() bool {
		p := fake.Services()[svc.Id]
		return backendOf(p, "198.18.0.10").GetHealth().GetState() == up &&
			backendOf(p, "198.18.0.11").GetHealth().GetState() == up
	})
}

// A service without a health check, and a disabled backend, get no probe at all.
func TestNoHealthCheckAndDisabledBackendAreNotProbed(t *testing.T) {
	st := openStore(t)
	plain, disabled, checked := newBackendServer(t), newBackendServer(t), newBackendServer(t)
	off := disabled.backend("198.18.0.21")
	off.State = lbdv1.BackendState_BACKEND_STATE_DISABLED
	create(t, st, service("plain", "203.0.113.20", nil, plain.backend("198.18.0.20")))
	create(t, st, service("mixed", "203.0.113.21", tcpCheck(), off, checked.backend("198.18.0.22")))
	run(t, st, Options{})

	// Both services are synced once the checked backend is up; let it be probed a few
	// more times, which is ample time for any probe of the others to show.
	waitHealth(t, st, "mixed", "198.18.0.22", up)
	seen := checked.conns.Load()
	eventually(t, "more probes of the checked backend", func() bool { return checked.conns.Load() >= seen+3 })

	if n := plain.conns.Load(); n != 0 {
		t.Errorf("backend of a service without health check got %d connections", n)
	}
	if n := disabled.conns.Load(); n != 0 {
		t.Errorf("disabled backend got %d connections", n)
	}
	if h := storedHealth(st, "plain", "198.18.0.20"); h != none {
		t.Errorf("unchecked backend has health %v", h)
	}
	if n := probeLoops(); n != 1 {
		t.Errorf("%d probe goroutines, want 1", n)
	}
}

// Editing the health check reaches the probes: a path that answers 404 takes the
// backend down, the right path brings it back.
func TestHealthCheckChangeIsPickedUp(t *testing.T) {
	st := openStore(t)
	srv := newBackendServer(t)
	svc := service("web", "203.0.113.30", httpCheck("/healthz"), srv.backend("198.18.0.30"))
	create(t, st, svc)
	run(t, st, Options{})
	waitHealth(t, st, "web", "198.18.0.30", up)

	svc.HealthCheck = httpCheck("/missing")
	if _, err := st.UpdateService(svc, 0); err != nil {
		t.Fatal(err)
	}
	got := waitHealth(t, st, "web", "198.18.0.30", down)
	if r := backendOf(got, "198.18.0.30").Health.LastResult; !strings.Contains(r, "status 404") {
		t.Errorf("last_result %q does not report the 404", r)
	}

	svc.HealthCheck = httpCheck("/healthz")
	if _, err := st.UpdateService(svc, 0); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, st, "web", "198.18.0.30", up)
}

// Removing the health check of a service, or disabling a backend, forgets the down
// state it had: the backend is usable again (or will be when re-enabled) without a
// probe to say so.
func TestUnprobedBackendsLoseTheirHealth(t *testing.T) {
	st := openStore(t)
	a, b := newBackendServer(t), newBackendServer(t)
	a.stop()
	b.stop()
	svc := service("web", "203.0.113.40", tcpCheck(), a.backend("198.18.0.40"), b.backend("198.18.0.41"))
	create(t, st, svc)
	run(t, st, Options{})
	waitHealth(t, st, "web", "198.18.0.40", down)
	waitHealth(t, st, "web", "198.18.0.41", down)

	svc.Backends[1].State = lbdv1.BackendState_BACKEND_STATE_DISABLED
	if _, err := st.UpdateService(svc, 0); err != nil {
		t.Fatal(err)
	}
	got := waitHealth(t, st, "web", "198.18.0.41", none)
	if r := backendOf(got, "198.18.0.41").Health.LastResult; r != "not probed: backend disabled" {
		t.Errorf("disabled backend's last_result %q", r)
	}
	if h := backendOf(got, "198.18.0.40").Health.State; h != down {
		t.Errorf("the other backend went %v", h)
	}

	svc.HealthCheck = nil
	if _, err := st.UpdateService(svc, 0); err != nil {
		t.Fatal(err)
	}
	got = waitHealth(t, st, "web", "198.18.0.40", none)
	if got.Status.UsableBackends != 1 {
		t.Errorf("%d usable backends after removing the health check, want 1", got.Status.UsableBackends)
	}
	eventually(t, "no probe goroutine left", func() bool { return probeLoops() == 0 })
}

// Deleting a service stops its probes and their goroutines; stopping Run leaves no
// goroutine of the checker or of healthsync behind.
func TestDeletingServiceStopsProbing(t *testing.T) {
	st := openStore(t)
	gone, kept := newBackendServer(t), newBackendServer(t)
	create(t, st, service("gone", "203.0.113.50", tcpCheck(), gone.backend("198.18.0.50")))
	create(t, st, service("kept", "203.0.113.51", tcpCheck(), kept.backend("198.18.0.51")))
	stop := run(t, st, Options{})
	waitHealth(t, st, "gone", "198.18.0.50", up)
	waitHealth(t, st, "kept", "198.18.0.51", up)

	if err := st.DeleteService("gone"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "one probe goroutine left", func() bool { return probeLoops() == 1 })
	seen := gone.conns.Load()
	from := kept.conns.Load()
	eventually(t, "more probes of the kept backend", func() bool { return kept.conns.Load() >= from+3 })
	if n := gone.conns.Load(); n != seen {
		t.Errorf("deleted service's backend still probed: %d connections, then %d", seen, n)
	}

	stop()
	// A goroutine that signalled its end (a closed channel, a WaitGroup's Done) is still
	// listed until it has returned: give it a moment, a leak stays.
	for _, fn := range []string{"daemon/health.", "healthsync.Run(", "healthsync.(*syncer)"} {
		deadline := time.Now().Add(2 * time.Second)
		n := countGoroutines(fn)
		for ; n != 0 && time.Now().Before(deadline); n = countGoroutines(fn) {
			time.Sleep(10 * time.Millisecond)
		}
		if n != 0 {
			t.Errorf("%d goroutines of %s left 2 s after Run returned", n, fn)
		}
	}
}

// A service deleted and created again between two syncs may get the same IDs, hence the
// same target keys. The store forgot the old health; so must the checker, or the new
// service's backend would never be reported down.
func TestServiceRecreatedWithinOneSyncStartsAfresh(t *testing.T) {
	st := openStore(t)
	srv := newBackendServer(t)
	srv.stop()
	spec := service("web", "203.0.113.60", tcpCheck(), srv.backend("198.18.0.60"))
	first := create(t, st, spec)
	s := newSyncer(st, Options{probeAddr: toLoopback})
	t.Cleanup(s.stop)
	s.sync()
	waitHealth(t, st, "web", "198.18.0.60", down)

	if err := st.DeleteService("web"); err != nil {
		t.Fatal(err)
	}
	again := create(t, st, spec)
	if again.Id != first.Id || again.Backends[0].Id != first.Backends[0].Id {
		t.Fatalf("IDs not reused (service %d→%d, backend %d→%d): the test needs them reused",
			first.Id, again.Id, first.Backends[0].Id, again.Backends[0].Id)
	}
	if h := storedHealth(st, "web", "198.18.0.60"); h != none {
		t.Fatalf("recreated service starts with health %v", h)
	}
	s.sync() // sees the deletion and the creation at once
	waitHealth(t, st, "web", "198.18.0.60", down)
}

// Without the test's address mapping: a backend on one of this host's own non-loopback
// addresses is probed at its real address.
func TestProbesTheBackendAddress(t *testing.T) {
	addr := hostAddress(t)
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	st := openStore(t)
	create(t, st, service("web", "203.0.113.70", tcpCheck(),
		&lbdv1.Backend{Address: addr.String(), Port: port}))
	run(t, st, Options{probeAddr: func(a netip.AddrPort) netip.AddrPort { return a }})
	waitHealth(t, st, "web", addr.String(), up)
	ln.Close()
	waitHealth(t, st, "web", addr.String(), down)
}

// hostAddress returns a global-unicast IPv4 address of this host, or skips the test.
func hostAddress(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skipf("needs a non-loopback address: list addresses: %v", err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err == nil && p.Addr().Is4() && p.Addr().IsGlobalUnicast() {
			return p.Addr()
		}
	}
	t.Skip("needs a non-loopback IPv4 address on this host")
	return netip.Addr{}
}

// specOf refuses what the checker would refuse, so one bad service cannot keep every
// other service's targets out of the checker.
func TestSpecOfRejectsWhatTheCheckerCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		path string
		host string
	}{
		{"space in path", "/a b", ""},
		{"bad escape in path", "/%zz", ""},
		{"slash in host", "/", "a/b"},
	} {
		hc := httpCheck(tc.path)
		hc.Host = tc.host
		if _, err := specOf(hc); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := specOf(httpCheck("/healthz?full=1")); err != nil {
		t.Errorf("valid check rejected: %v", err)
	}
}

// A check the prober could not run never reaches it: the store refuses it at the API,
// and the services that are accepted are probed.
func TestUnrunnableCheckRefusedByStore(t *testing.T) {
	st := openStore(t)
	good := newBackendServer(t)
	if _, err := st.CreateService(service("bad", "203.0.113.80", httpCheck("/%zz"), good.backend("198.18.0.80"))); err == nil {
		t.Fatal("the store accepted a health check path the prober cannot send")
	}
	create(t, st, service("good", "203.0.113.81", tcpCheck(), good.backend("198.18.0.81")))
	run(t, st, Options{})
	waitHealth(t, st, "good", "198.18.0.81", up)
}

// A health change comes back from the store as an event; it must not make the checker
// rebuild its targets (at 1,000 backends that is 1,000 probers per transition). Nor must
// a spec change that probes nothing differently.
func TestHealthEventsDoNotRebuildTargets(t *testing.T) {
	st := openStore(t)
	srv := newBackendServer(t)
	svc := service("web", "203.0.113.90", tcpCheck(), srv.backend("198.18.0.90"))
	create(t, st, svc)
	logs := &lockedBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})
	s := newSyncer(st, Options{Logger: log, probeAddr: toLoopback})
	t.Cleanup(s.stop)
	sets := func() int { return strings.Count(logs.String(), "health targets set") }

	s.sync()
	waitHealth(t, st, "web", "198.18.0.90", up)
	srv.stop()
	waitHealth(t, st, "web", "198.18.0.90", down)
	s.sync() // the two health events
	if n := sets(); n != 1 {
		t.Errorf("checker targets set %d times, want once:\n%s", n, logs.String())
	}
	svc.Backends[0].Weight = 2 // a new revision that probes nothing differently
	if _, err := st.UpdateService(svc, 0); err != nil {
		t.Fatal(err)
	}
	s.sync()
	if n := sets(); n != 1 {
		t.Errorf("checker targets set %d times after a weight change, want once", n)
	}

	svc.Backends = append(svc.Backends, &lbdv1.Backend{Address: "198.18.0.91", Port: 80})
	if _, err := st.UpdateService(svc, 0); err != nil {
		t.Fatal(err)
	}
	s.sync()
	if n := sets(); n != 2 {
		t.Errorf("checker targets set %d times after adding a backend, want twice", n)
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
