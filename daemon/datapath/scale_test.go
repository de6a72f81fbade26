//go:build linux

package datapath

import (
	"context"
	"fmt"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/daemon/maglev"
	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// The scale of the control plane's datapath side: N services × 10 backends synced into
// the real maps from empty, one backend's weight changed at a time through the store and
// the reconciler, and a restart that finds the maps as they should be. TestScale runs
// it at 1,000 services and checks what the maps hold; the benchmarks at 10,000 report
// the figures (docs/operations.md).

// scaleNode is a datapath manager holding n services of 10 backends, synced from empty.
type scaleNode struct {
	node *node
	m    *Manager
	svcs []*lbdv1.Service
	took time.Duration // the sync from empty
	heap uint64        // Go heap in use before the manager was opened
}

func newScaleNode(tb testing.TB, n int, size uint32) *scaleNode {
	tb.Helper()
	s := &scaleNode{node: newNode(tb), svcs: manyServices(n, 10, size)}
	s.heap = heapInUse()
	s.m = s.node.open(tb, s.node.config(1<<16))
	typed := modeltest.All(s.svcs...)
	start := time.Now()
	if _, err := s.m.Sync(context.Background(), typed); err != nil {
		tb.Fatal(err)
	}
	s.took = time.Since(start)
	return s
}

// restart closes the manager as SIGTERM does, opens a new one on the same pins and
// syncs the same services: what a restarted lbd does before it reports ready.
func (s *scaleNode) restart(tb testing.TB) time.Duration {
	tb.Helper()
	if err := s.m.Close(); err != nil {
		tb.Fatal(err)
	}
	typed := modeltest.All(s.svcs...)
	start := time.Now()
	s.m = s.node.open(tb, s.node.config(1<<16))
	if _, err := s.m.Sync(context.Background(), typed); err != nil {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// checkTables compares every table in the maps with one built here, independently of
// the manager, from the service as the store hands it over.
func (s *scaleNode) checkTables(tb testing.TB) {
	tb.Helper()
	for _, svc := range s.svcs {
		var bs []maglev.Backend
		for _, b := range svc.Backends {
			bs = append(bs, maglev.Backend{ID: b.Id, Key: fmt.Sprintf("%s:%d", b.Address, b.Port), Weight: b.Weight})
		}
		want, err := maglev.Build(bs, maglev.TableSize(svc.MaglevTableSize, len(bs), uint64(len(bs))))
		if err != nil {
			tb.Fatal(err)
		}
		st, err := s.m.lb.ReadTable(svc.Id)
		if err != nil || st == nil || !st.Intact || !slices.Equal(st.IDs(), want) {
			tb.Fatalf("service %s: the maps do not hold its table (%v)", svc.Name, err)
		}
	}
}

// memory is the kernel memory (memlock) of the LB maps by name, the services' tables
// under "tables".
func (s *scaleNode) memory(tb testing.TB) map[string]uint64 {
	tb.Helper()
	out := map[string]uint64{}
	info, err := s.m.lb.Program().Info()
	if err != nil {
		tb.Fatal(err)
	}
	ids, _ := info.MapIDs()
	for _, id := range ids {
		mp, err := ebpf.NewMapFromID(id)
		if err != nil {
			tb.Fatal(err)
		}
		mi, err := mp.Info()
		mp.Close()
		if err != nil {
			tb.Fatal(err)
		}
		n, _ := mi.Memlock()
		out[mi.Name] += n
	}
	for _, svc := range s.svcs {
		n, err := s.m.lb.TableMapMemlock(svc.Id)
		if err != nil {
			tb.Fatal(err)
		}
		out["tables"] += n
	}
	return out
}

// withoutConntrack sums map memory but conntrack's (the LB role has no NAT map).
func withoutConntrack(mem map[string]uint64) uint64 {
	var sum uint64
	for name, n := range mem {
		if !strings.HasPrefix(name, "lb_ct") {
			sum += n
		}
	}
	return sum
}

// cpuTime is the CPU time (user and system) of the process so far: on a machine
// shared with other work, CPU time over the CPUs available bounds what the wall time
// would be on an idle one.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapInUse is the Go heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// rss reads a field of /proc/self/status in bytes (VmRSS, VmHWM).
func rss(field string) uint64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// storeNode is the same state behind a real store and reconciler: a change goes in at
// the store, as an UpdateBackend call does, and is timed until the reconciler has
// written it (its Observe hook runs once the datapath call returned).
type storeNode struct {
	st      *store.Store
	applied chan struct{}
}

func newStoreNode(tb testing.TB, m *Manager, svcs []*lbdv1.Service) *storeNode {
	tb.Helper()
	lim := store.DefaultLimits()
	lim.MaxBackends = 10 * len(svcs)
	lim.MaxServices = max(lim.MaxServices, len(svcs))
	st, err := store.Open(store.Options{Limits: lim, HoldIDs: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	in := make([]*lbdv1.Service, len(svcs))
	for i, s := range svcs {
		in[i] = proto.Clone(s).(*lbdv1.Service)
	}
	if _, err := st.ApplyServices("scale", in); err != nil {
		tb.Fatal(err)
	}
	sn := &storeNode{st: st, applied: make(chan struct{}, 1)}
	r := reconcile.New(st, m, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
	// The store gave the services IDs of its own: the reconciler's first sync writes
	// them all; wait for it before timing anything.
	deadline := time.Now().Add(5 * time.Minute)
	for _, s := range svcs {
		for {
			got, err := st.GetService(s.Name)
			if err == nil && got.Status.GetState() == lbdv1.ServiceState_SERVICE_STATE_READY {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("service %s not programmed: %v", s.Name, got.GetStatus())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	r.Observe = func(time.Duration) {
		select {
		case sn.applied <- struct{}{}:
		default:
		}
	}
	return sn
}

// weightChanges changes one backend's weight in k services in turn, each time waiting
// until the reconciler has written it, and returns how long each took from the call.
func (sn *storeNode) weightChanges(tb testing.TB, svcs []*lbdv1.Service, k, round int) []time.Duration {
	tb.Helper()
	lat := make([]time.Duration, 0, k)
	for i := range k {
		svc := svcs[(i*7919+round*31)%len(svcs)]
		b := svc.Backends[(i+round)%len(svc.Backends)]
		w := b.Weight%3 + 1
		start := time.Now()
		_, err := sn.st.UpdateBackendFields(svc.Name, &lbdv1.Backend{Address: b.Address, Port: b.Port, Weight: w},
			store.BackendUpdate{Fields: []string{"weight"}})
		if err != nil {
			tb.Fatal(err)
		}
		select {
		case <-sn.applied:
		case <-time.After(time.Minute):
			tb.Fatalf("weight change %d not applied within a minute", i)
		}
		lat = append(lat, time.Since(start))
		b.Weight = w
	}
	return lat
}

func quantile(lat []time.Duration, q float64) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// TestScale is the scaled-down run of the scale benchmarks, checking what they only
// time: 1,000 services × 10 backends (tables of derived size) reach the maps from
// empty, each table as built independently here and charged exactly as the memory
// budget says; 20 weight changes through the store each reach the maps; a restart
// writes nothing and reports the same shares.
func TestScale(t *testing.T) {
	s := newScaleNode(t, 1000, 0)
	select {
	case <-s.m.Synced():
	default:
		t.Fatal("Synced is not closed after the first sync")
	}
	s.checkTables(t)
	mem := s.memory(t)
	for _, svc := range s.svcs[:10] {
		if n, _ := s.m.lb.TableMapMemlock(svc.Id); n != s.m.TableBytes(svc) {
			t.Errorf("service %s: table map of %d bytes, the budget counts %d", svc.Name, n, s.m.TableBytes(svc))
		}
	}
	t.Logf("1,000 services: sync from empty %v; tables %.1f MiB, maps without conntrack %.1f MiB, Go heap +%.1f MiB",
		s.took, float64(mem["tables"])/(1<<20), float64(withoutConntrack(mem))/(1<<20), float64(heapInUse()-min(heapInUse(), s.heap))/(1<<20))

	sn := newStoreNode(t, s.m, s.svcs)
	before := s.m.MapWrites()
	lat := sn.weightChanges(t, s.svcs, 20, 0)
	if s.m.MapWrites() == before {
		t.Fatal("20 weight changes wrote nothing")
	}
	for _, svc := range s.svcs {
		got, err := sn.st.GetService(svc.Name)
		if err != nil {
			t.Fatal(err)
		}
		svc.Id = got.Id
		for i, b := range got.Backends {
			svc.Backends[i].Id, svc.Backends[i].Weight = b.Id, b.Weight
		}
	}
	s.checkTables(t)
	t.Logf("weight changes through the store: p50 %v, max %v", quantile(lat, 0.5), quantile(lat, 1))

	shares := map[uint32]map[uint32]uint32{}
	for id, p := range s.m.programmed {
		shares[id] = p.table.shares
	}
	took := s.restart(t)
	if w := s.m.MapWrites(); w != 0 {
		t.Fatalf("the restart wrote %d map entries, want none", w)
	}
	for id, p := range s.m.programmed {
		if !maps.Equal(p.table.shares, shares[id]) {
			t.Fatalf("service %d: shares %v after the restart, %v before", id, p.table.shares, shares[id])
		}
	}
	t.Logf("restart check: %v, no write", took)
}

// BenchmarkSyncFromEmpty syncs 10,000 services × 10 backends into empty maps, with
// tables of derived size (2039 slots) and of 65537 slots asked for explicitly. Each
// run reports the sync time (ns/op), the tables' and the maps' kernel memory but
// conntrack's, and the Go heap the manager holds. The baseline in the same run,
// maglev-only, builds the same tables on every CPU without the kernel: the part of a
// sync no representation can save.
func BenchmarkSyncFromEmpty(b *testing.B) {
	for _, size := range []uint32{0, 65537} {
		name := "size=derived"
		if size != 0 {
			name = fmt.Sprintf("size=%d", size)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				svcs := manyServices(10000, 10, size)
				typed := modeltest.All(svcs...)
				nd := newNode(b)
				heap := heapInUse()
				m := nd.open(b, nd.config(1<<16))
				cpu := cpuTime()
				b.StartTimer()
				if _, err := m.Sync(context.Background(), typed); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				b.ReportMetric((cpuTime() - cpu).Seconds(), "cpu-s")
				s := &scaleNode{node: nd, m: m, svcs: svcs}
				mem := s.memory(b)
				b.ReportMetric(float64(mem["tables"])/(1<<20), "tables-MiB")
				b.ReportMetric(float64(withoutConntrack(mem))/(1<<20), "maps-but-ct-MiB")
				b.ReportMetric(float64(heapInUse()-min(heapInUse(), heap))/(1<<20), "heap-MiB")
				b.ReportMetric(float64(rss("VmHWM"))/(1<<20), "peak-RSS-MiB")
				if err := m.Detach(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run(name+"/maglev-only", func(b *testing.B) {
			svcs := manyServices(10000, 10, size)
			var plans []*plan
			for _, svc := range svcs {
				p, err := desired(modeltest.Of(svc))
				if err != nil {
					b.Fatal(err)
				}
				plans = append(plans, p)
			}
			cpu := cpuTime()
			for b.Loop() {
				parallel(len(plans), func(i int) {
					t := plans[i].want.table
					if _, err := maglev.BuildIndexed(t.usable, t.size); err != nil {
						panic(err)
					}
				})
			}
			b.ReportMetric((cpuTime()-cpu).Seconds()/float64(b.N), "cpu-s")
		})
	}
}

// BenchmarkWeightChange changes one backend's weight at a time, 200 per run, at
// 10,000 services × 10 backends (derived sizes), through the store and the reconciler
// into the maps; p50 and p99 are over all changes of the benchmark. The baseline in the
// same run, unchanged, times a datapath call that finds nothing to write.
func BenchmarkWeightChange(b *testing.B) {
	s := newScaleNode(b, 10000, 0)
	sn := newStoreNode(b, s.m, s.svcs)
	b.Run("store-to-maps", func(b *testing.B) {
		var lat []time.Duration
		round := 0
		for b.Loop() {
			lat = append(lat, sn.weightChanges(b, s.svcs, 200, round)...)
			round++
		}
		b.ReportMetric(ms(quantile(lat, 0.5)), "p50-ms")
		b.ReportMetric(ms(quantile(lat, 0.99)), "p99-ms")
	})
	b.Run("unchanged", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			for i := range 200 {
				got, err := sn.st.GetService(s.svcs[(i*7919)%len(s.svcs)].Name)
				if err != nil {
					b.Fatal(err)
				}
				typed := modeltest.Of(got)
				start := time.Now()
				if _, err := s.m.Upsert(context.Background(), typed); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
		}
		b.ReportMetric(ms(quantile(lat, 0.5)), "p50-ms")
		b.ReportMetric(ms(quantile(lat, 0.99)), "p99-ms")
	})
}

// BenchmarkRestartCheck restarts the manager on the pins of 10,000 services × 10
// backends (derived sizes) and syncs the same services: it must write nothing (the run
// fails otherwise). ns/op is the time from the new Open to the end of the sync, split
// into open-s and sync-s; the baseline is BenchmarkSyncFromEmpty in the same run.
func BenchmarkRestartCheck(b *testing.B) {
	s := newScaleNode(b, 10000, 0)
	var cpu, open, sync time.Duration
	for b.Loop() {
		b.StopTimer()
		if err := s.m.Close(); err != nil {
			b.Fatal(err)
		}
		typed := modeltest.All(s.svcs...)
		c := cpuTime()
		b.StartTimer()
		start := time.Now()
		s.m = s.node.open(b, s.node.config(1<<16))
		opened := time.Now()
		if _, err := s.m.Sync(context.Background(), typed); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cpu += cpuTime() - c
		open, sync = open+opened.Sub(start), sync+time.Since(opened)
		if w := s.m.MapWrites(); w != 0 {
			b.Fatalf("the restart wrote %d map entries", w)
		}
		b.StartTimer()
	}
	b.ReportMetric(0, "writes")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s")
	// Open loads and verifies the programs and reads every table's head and slots;
	// Sync compares digests.
	b.ReportMetric(open.Seconds()/float64(b.N), "open-s")
	b.ReportMetric(sync.Seconds()/float64(b.N), "sync-s")
}
