package store

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"

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
	t := s.begin()
	defer t.abort()
	path := filepath.Join(b.TempDir(), "state.pb")
	b.ReportAllocs()
	var size int
	for b.Loop() {
		data, err := encodeState(t.state())
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
