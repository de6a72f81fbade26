package store

import (
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// benchServices returns n services with per backends each, all valid.
func benchServices(n, per int) []*lbdv1.Service {
	out := make([]*lbdv1.Service, n)
	for i := range n {
		s := &lbdv1.Service{
			Name: fmt.Sprintf("ns-%d/svc-%d", i/100, i), Vip: fmt.Sprintf("203.0.113.%d", i%250+1),
			Port: uint32(1000 + i/250), Protocol: lbdv1.Protocol_PROTOCOL_TCP,
		}
		for j := range per {
			s.Backends = append(s.Backends, &lbdv1.Backend{Address: fmt.Sprintf("198.18.%d.%d", j+1, i%250+1), Port: 8080})
		}
		out[i] = s
	}
	return out
}

func reportPeakRSS(b *testing.B) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		b.ReportMetric(float64(ru.Maxrss)/1024, "peak-RSS-MB")
	}
}

// BenchmarkApplyServices10k measures one ApplyServices of 10,000 services × 10 backends
// into an empty store, persistence included. Its baselines in the same run are
// BenchmarkApplyServices10kUnchanged (validation and diff only: nothing to write) and
// BenchmarkPersist10k (the state file write alone).
func BenchmarkApplyServices10k(b *testing.B) {
	svcs := benchServices(10000, 10)
	lim := DefaultLimits()
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		s, err := Open(Options{Path: filepath.Join(dir, "state.pb"), Limits: lim})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := s.ApplyServices("bench", svcs)
		if err != nil || res.Created != 10000 {
			b.Fatalf("apply: %v %+v", err, res)
		}
		b.StopTimer()
		s.Close()
		b.StartTimer()
	}
	reportPeakRSS(b)
}

func BenchmarkApplyServices10kUnchanged(b *testing.B) {
	svcs := benchServices(10000, 10)
	s, err := Open(Options{Path: filepath.Join(b.TempDir(), "state.pb"), Limits: DefaultLimits()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.ApplyServices("bench", svcs); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.ApplyServices("bench", svcs)
		if err != nil || res.Unchanged != 10000 {
			b.Fatalf("apply: %v %+v", err, res)
		}
	}
	reportPeakRSS(b)
}

// BenchmarkPersist10k measures writing the state of 10,000 services × 10 backends:
// encoding plus the atomic write (temp file, fsync, rename, fsync dir).
func BenchmarkPersist10k(b *testing.B) {
	s, err := Open(Options{Limits: DefaultLimits()})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.ApplyServices("bench", benchServices(10000, 10)); err != nil {
		b.Fatal(err)
	}
	s.writeMu.Lock()
	st := s.snapshot()
	s.writeMu.Unlock()
	path := filepath.Join(b.TempDir(), "state.pb")
	b.ReportAllocs()
	var size int
	for b.Loop() {
		data, err := encodeState(st)
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
		if err := writeFileAtomic(path, data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size)/(1<<20), "file-MB")
}

// BenchmarkCreateServiceAt1k measures one CreateService (persisted) in a store that
// already holds 1,000 services × 10 backends: the per-call cost an operator sees.
func BenchmarkCreateServiceAt1k(b *testing.B) {
	s, err := Open(Options{Path: filepath.Join(b.TempDir(), "state.pb"), Limits: DefaultLimits()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.ApplyServices("bench", benchServices(1000, 10)); err != nil {
		b.Fatal(err)
	}
	extra := benchServices(1, 10)[0]
	extra.Name, extra.Vip = "extra", "203.0.113.253"
	for b.Loop() {
		if _, err := s.CreateService(extra); err != nil {
			b.Fatal(err)
		}
		if err := s.DeleteService("extra"); err != nil {
			b.Fatal(err)
		}
	}
}

// openBench returns a persisted store holding n services × 10 backends.
func openBench(b *testing.B, n int) (*Store, []*lbdv1.Service) {
	b.Helper()
	svcs := benchServices(n, 10)
	s, err := Open(Options{Path: filepath.Join(b.TempDir(), "state.pb"), Limits: DefaultLimits(), HoldIDs: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if _, err := s.ApplyServices("bench", svcs); err != nil {
		b.Fatal(err)
	}
	s.waitCompaction()
	return s, svcs
}

// setWeight changes the weight of one backend of the i-th service, as
// `lbctl backend set-weight` does, and returns how long the call took.
func setWeight(b *testing.B, s *Store, svcs []*lbdv1.Service, i int) time.Duration {
	svc := svcs[i*7919%len(svcs)]
	be := svc.Backends[i%len(svc.Backends)]
	start := time.Now()
	_, err := s.UpdateBackendFields(svc.Name, &lbdv1.Backend{Address: be.Address, Port: be.Port, Weight: uint32(2 + i%3)},
		BackendUpdate{Fields: []string{"weight"}})
	d := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkUpdateBackendAt10k measures one weight change (UpdateBackend with a field
// mask, persisted) in a store of 10,000 services × 10 backends: p50-ms and p99-ms of
// the calls, and x-vs-100, the ratio of their mean to that of the same calls in a store
// of 100 services measured in the same run (about 1 when the cost of a change does not
// grow with the state).
func BenchmarkUpdateBackendAt10k(b *testing.B) {
	small, smallSvcs := openBench(b, 100)
	var base time.Duration
	const baseCalls = 200
	for i := range baseCalls {
		base += setWeight(b, small, smallSvcs, i)
	}
	s, svcs := openBench(b, 10000)
	var times []time.Duration
	i := 0
	for b.Loop() {
		times = append(times, setWeight(b, s, svcs, i))
		i++
	}
	reportLatency(b, times)
	var sum time.Duration
	for _, d := range times {
		sum += d
	}
	b.ReportMetric(float64(sum)/float64(len(times))/(float64(base)/baseCalls), "x-vs-100")
}

// reportLatency reports the median and 99th percentile of call times.
func reportLatency(b *testing.B, times []time.Duration) {
	slices.Sort(times)
	pct := func(p float64) float64 {
		return float64(times[min(len(times)-1, int(p*float64(len(times))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// BenchmarkListServices10k measures listing 10,000 services × 10 backends in pages of
// 500, the way `lbctl service list` asks for them.
func BenchmarkListServices10k(b *testing.B) {
	s, _ := openBench(b, 10000)
	b.ReportAllocs()
	for b.Loop() {
		n, after := 0, ""
		for {
			page, more := s.ListServicesPage("", after, 500)
			n += len(page)
			if !more {
				break
			}
			after = page[len(page)-1].Name
		}
		if n != 10000 {
			b.Fatalf("listed %d services", n)
		}
	}
}

// reachAll is every backend node of benchServices reachable, with reason.
func reachAll(svcs []*lbdv1.Service, reason string) map[netip.Addr]NodeReach {
	out := map[netip.Addr]NodeReach{}
	for _, s := range svcs {
		for _, b := range s.Backends {
			out[netip.MustParseAddr(b.Address)] = NodeReach{Reachable: true, Reason: reason}
		}
	}
	return out
}

// BenchmarkNodeReachabilityAt10k measures what the store does with the next-hop
// tracker's report at 10,000 services × 10 backends over 2,500 backend nodes: one node
// becoming unreachable (and reachable again: two calls an op), and the neighbour of
// every node changing state while all stay reachable (churn: two calls an op), which
// the tracker reports as new reasons for every path. events counts the events the
// store emitted per call.
func BenchmarkNodeReachabilityAt10k(b *testing.B) {
	s, svcs := openBench(b, 10000)
	var events int
	_, _, stop := s.SnapshotAndListen(func(evs []Event) { events += len(evs) })
	defer stop()
	up, stale := reachAll(svcs, "via 198.19.255.2 dev eth0, neighbour REACHABLE (managed)"), reachAll(svcs, "via 198.19.255.2 dev eth0, neighbour STALE (managed)")
	s.SetNodeReachability(up)
	one := maps.Clone(up)
	one[netip.MustParseAddr(svcs[0].Backends[0].Address)] = NodeReach{Reason: "next hop does not answer"}
	b.Run("one-node", func(b *testing.B) {
		events = 0
		for b.Loop() {
			s.SetNodeReachability(one)
			s.SetNodeReachability(up)
		}
		b.ReportMetric(float64(events)/float64(2*b.N), "events/call")
	})
	b.Run("churn", func(b *testing.B) {
		events = 0
		for b.Loop() {
			s.SetNodeReachability(stale)
			s.SetNodeReachability(up)
		}
		b.ReportMetric(float64(events)/float64(2*b.N), "events/call")
	})
}
