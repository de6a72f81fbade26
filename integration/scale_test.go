//go:build linux

package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// The scale benchmark and its scaled-down test (scale_topo_test.go has the node): N
// services × 10 backends applied to a real lbd with XDP attached, from empty into the
// maps, its memory, a restart that keeps the pins, `lbctl service list`, and 100
// watchers while changes stream. docs/operations.md has the figures and how to read
// them.

const (
	scaleBackends = 10
	// The test's scale: every step of the benchmark, checked, in seconds.
	scaleTestServices = 200
	// The benchmark's scale.
	scaleBenchServices = 10000
	// bigTable is the table size the benchmark also asks for explicitly.
	bigTable = 65537
	// Watchers and changes of the watch step.
	scaleWatchers = 100
	scaleChanges  = 1000
)

const mib = 1 << 20

// TestScale runs every step of BenchmarkScale at a small scale and checks what each
// must do; it asserts nothing about speed.
func TestScale(t *testing.T) {
	n := newScaleNode(t)
	n.start()
	n.waitFor("an empty node ready", time.Minute, n.ready)
	svcs := scaleServices(scaleTestServices, scaleBackends, 0)
	took, call := n.applyAll(svcs)
	t.Logf("%d services × %d backends: in the maps %v after the call (the call %v)", len(svcs), scaleBackends, took, call)
	n.traceSample(svcs, 20)
	svcMem, learned, maps := n.mapMemory()
	t.Logf("lbd RSS %.0f MiB; %d maps: %.1f MiB for the services, %.1f MiB of conntrack", float64(n.rssBytes())/mib, maps, float64(svcMem)/mib, float64(learned)/mib)

	r := n.restart(svcs, true)
	t.Logf("restart: API answered after %v, a trace after %v, ready after %v; the drain meanwhile, %d map writes", r.api, r.trace, r.ready, r.writes)
	if r.drain == nil {
		t.Error("no drain was tried while the node restarted")
	} else if *r.drain != nil {
		t.Errorf("a drain right after the API answered: %v", *r.drain)
	}
	n.traceSample(svcs, 20)
	// Restarted again with the state as the maps hold it (the drain was undone): the
	// first sync finds every table as it should be and writes nothing.
	if r = n.restart(svcs, false); r.writes != 0 {
		t.Errorf("the sync after a restart wrote %d map entries, want none", r.writes)
	}
	t.Logf("restart without a change: ready after %v, %d map writes", r.ready, r.writes)

	for _, format := range []string{"table", "json"} {
		d, out := n.lbctlList(format)
		if c := n.countListed(format, out); c != len(svcs) {
			t.Errorf("lbctl service list -o %s listed %d services, want %d", format, c, len(svcs))
		}
		t.Logf("lbctl service list -o %s: %v", format, d)
	}

	w := n.watchChanges(svcs, 10, 200)
	t.Logf("10 watchers, 200 changes: every watcher saw every change in %v; lbd RSS %.0f MiB before, %.0f MiB at the peak, %.0f MiB at the end",
		w.took, float64(w.rssBefore)/mib, float64(w.rssPeak)/mib, float64(w.rssEnd)/mib)

	small := newScaleNode(t)
	small.start()
	small.waitFor("an empty node ready", time.Minute, small.ready)
	big := scaleServices(scaleTestServices/2, scaleBackends, bigTable)
	took, _ = small.applyAll(big)
	small.traceSample(big, 10)
	t.Logf("%d services with %d-slot tables: in the maps %v after the call", len(big), bigTable, took)
}

// BenchmarkScale measures, at 10,000 services × 10 backends: the time from an
// ApplyServices call into an empty lbd until the maps hold every service (s-to-maps,
// with the default and with explicit 65,537-slot tables), lbd's CPU time meanwhile
// (lbd-cpu-s), its RSS and the map memory then (rss-MiB, maps-MiB, conntrack-MiB
// apart); a restart that keeps the pins (api-s, trace-s, ready-s; lbd's CPU time from
// its start until ready, lbd-cpu-s; the map entries its first sync wrote, writes,
// which must be none; and the RSS and map memory after it, also as ratios to before:
// x-rss, x-maps); `lbctl service list` (table-s, json-s); and 100 watchers while 1,000
// changes stream (watch-s; lbd's RSS before the watchers connect, rss-before-MiB, and
// how much it grew from there: at its peak while they connected and the changes
// streamed, rss-peak-growth-MiB, and once every watcher had seen every change,
// rss-end-growth-MiB).
func BenchmarkScale(b *testing.B) {
	for _, tc := range []struct {
		name  string
		table uint32
	}{{"apply-default", 0}, {"apply-65537", bigTable}} {
		b.Run(tc.name, func(b *testing.B) {
			in := scaleServices(scaleBenchServices, scaleBackends, tc.table)
			var took, call, cpu time.Duration
			var rss, svcMem, learned float64
			for b.Loop() {
				b.StopTimer()
				n := newScaleNode(b)
				n.start()
				n.waitFor("an empty node ready", time.Minute, n.ready)
				c0 := n.cpuTime()
				b.StartTimer()
				d, c := n.applyAll(in)
				b.StopTimer()
				cpu += n.cpuTime() - c0
				n.traceSample(in, 50)
				took, call = took+d, call+c
				m, l, _ := n.mapMemory()
				rss, svcMem, learned = rss+float64(n.rssBytes()), svcMem+float64(m), learned+float64(l)
				n.stop()
				b.StartTimer()
			}
			per := float64(b.N)
			b.ReportMetric(took.Seconds()/per, "s-to-maps")
			b.ReportMetric(call.Seconds()/per, "call-s")
			b.ReportMetric(cpu.Seconds()/per, "lbd-cpu-s")
			b.ReportMetric(rss/per/mib, "rss-MiB")
			b.ReportMetric(svcMem/per/mib, "maps-MiB")
			b.ReportMetric(learned/per/mib, "conntrack-MiB")
		})
	}
	// The other steps go on from one node holding the services.
	svcs := scaleServices(scaleBenchServices, scaleBackends, 0)
	node := newScaleNode(b)
	node.start()
	node.waitFor("an empty node ready", time.Minute, node.ready)
	node.applyAll(svcs)
	b.Run("restart", func(b *testing.B) {
		node.tb = b
		var sum restartRun
		var rss, maps float64
		var writes uint64
		rssBefore := float64(node.rssBytes())
		mapsBefore, _, _ := node.mapMemory()
		for b.Loop() {
			r := node.restart(svcs, false)
			if r.writes != 0 {
				b.Fatalf("the sync after a restart wrote %d map entries, want none", r.writes)
			}
			writes += r.writes
			sum.api, sum.trace, sum.ready, sum.cpu = sum.api+r.api, sum.trace+r.trace, sum.ready+r.ready, sum.cpu+r.cpu
			b.StopTimer()
			m, _, _ := node.mapMemory()
			rss, maps = rss+float64(node.rssBytes()), maps+float64(m)
			node.traceSample(svcs, 50)
			b.StartTimer()
		}
		per := float64(b.N)
		b.ReportMetric(sum.api.Seconds()/per, "api-s")
		b.ReportMetric(sum.trace.Seconds()/per, "trace-s")
		b.ReportMetric(sum.ready.Seconds()/per, "ready-s")
		b.ReportMetric(sum.cpu.Seconds()/per, "lbd-cpu-s")
		b.ReportMetric(float64(writes)/per, "writes")
		b.ReportMetric(rss/per/mib, "rss-MiB")
		b.ReportMetric(rss/per/rssBefore, "x-rss")
		b.ReportMetric(maps/per/float64(mapsBefore), "x-maps")
	})
	b.Run("list", func(b *testing.B) {
		node.tb = b
		var table, json time.Duration
		for b.Loop() {
			d, _ := node.lbctlList("table")
			table += d
			d, _ = node.lbctlList("json")
			json += d
		}
		b.ReportMetric(table.Seconds()/float64(b.N), "table-s")
		b.ReportMetric(json.Seconds()/float64(b.N), "json-s")
	})
	b.Run("watch", func(b *testing.B) {
		node.tb = b
		var took time.Duration
		var before, peak, end float64
		for b.Loop() {
			w := node.watchChanges(svcs, scaleWatchers, scaleChanges)
			took += w.took
			before += float64(w.rssBefore)
			peak += float64(w.rssPeak) - float64(w.rssBefore)
			end += float64(w.rssEnd) - float64(w.rssBefore)
		}
		per := float64(b.N)
		b.ReportMetric(took.Seconds()/per, "watch-s")
		b.ReportMetric(before/per/mib, "rss-before-MiB")
		b.ReportMetric(peak/per/mib, "rss-peak-growth-MiB")
		b.ReportMetric(end/per/mib, "rss-end-growth-MiB")
	})
	node.tb = b
}

// restartRun is what one restart took: until the API answered from the restored state,
// until a trace answered, until the node was ready. drain is the result of a drain
// asked right after the API answered (nil if none was asked); writes are the map
// entries the first sync wrote, as lbd's log says.
type restartRun struct {
	api, trace, ready time.Duration
	cpu               time.Duration // lbd's CPU time from its start until ready
	drain             *error
	writes            uint64
}

// restart stops lbd with SIGTERM (the pins stay) and starts it again with the same state,
// timing the API, a trace and readiness; with drain it also drains a backend as soon as
// the API answers, and undrains it once ready.
func (n *scaleNode) restart(svcs []*lbdv1.Service, drain bool) restartRun {
	n.tb.Helper()
	n.stop()
	start := time.Now()
	n.start()
	var r restartRun
	last := svcs[len(svcs)-1]
	r.api = n.waitFor("the API after a restart", time.Minute, n.answers(last.Name)).Sub(start)
	var drained error
	if drain {
		drained = n.setState(last, lbdv1.BackendState_BACKEND_STATE_DRAINING)
		r.drain = &drained
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		r.trace = n.waitFor("a trace after a restart", 10*time.Minute, func(ctx context.Context) error {
			return n.traced(ctx, svcs[0], 40001)
		}).Sub(start)
	})
	r.ready = n.waitFor("readiness after a restart", 10*time.Minute, n.ready).Sub(start)
	r.cpu = n.cpuTime()
	wg.Wait()
	r.writes = n.syncWrites()
	if r.drain != nil && drained == nil {
		if err := n.setState(last, lbdv1.BackendState_BACKEND_STATE_ACTIVE); err != nil {
			n.tb.Fatal(err)
		}
		n.waitFor("the undrain programmed", time.Minute, n.programmed(last))
	}
	return r
}

// setState changes the state of a service's first backend.
func (n *scaleNode) setState(svc *lbdv1.Service, st lbdv1.BackendState) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := svc.Backends[0]
	_, err := n.lb.UpdateBackend(ctx, &lbdv1.UpdateBackendRequest{ServiceName: svc.Name,
		Backend: &lbdv1.Backend{Address: b.Address, Port: b.Port, State: st}})
	return err
}

// lbctlList runs `lbctl service list` and returns how long it took and its output.
func (n *scaleNode) lbctlList(format string) (time.Duration, []byte) {
	n.tb.Helper()
	cmd := exec.Command(n.lbctlBin, "-s", "unix://"+n.sock, "--timeout", "60s", "-o", format, "service", "list")
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		n.tb.Fatalf("lbctl service list -o %s: %v", format, err)
	}
	return took, out
}

// countListed counts the services in lbctl's output.
func (n *scaleNode) countListed(format string, out []byte) int {
	n.tb.Helper()
	if format == "table" {
		return strings.Count(string(out), "\n") - 1
	}
	var list lbdv1.ListServicesResponse
	if err := protojson.Unmarshal(out, &list); err != nil {
		n.tb.Fatalf("lbctl service list -o json: %v", err)
	}
	return len(list.Services)
}

// watchRun is what one watch step measured: how long until every watcher had seen
// every change, and lbd's RSS before the watchers connected, at its peak from then
// until every watcher had seen every change (VmHWM, reset before), and at that end.
type watchRun struct {
	took                       time.Duration
	rssBefore, rssPeak, rssEnd uint64
}

// watchChanges opens k watches, reads each to SYNCED, then makes c changes (a weight,
// service after service) and waits until every watcher has seen every one of them (the
// revision each change gave its service). It fails if a watcher misses one or ends.
func (n *scaleNode) watchChanges(svcs []*lbdv1.Service, k, c int) watchRun {
	n.tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n.resetPeakRSS()
	r := watchRun{rssBefore: n.rssBytes()}
	type watcher struct {
		mu   sync.Mutex
		seen map[string]uint64 // highest revision seen, by service
		err  error
		cond chan struct{}
	}
	ws := make([]*watcher, k)
	synced := make(chan error, k)
	for i := range ws {
		w := &watcher{seen: map[string]uint64{}, cond: make(chan struct{}, 1)}
		ws[i] = w
		// Each watcher is a client of its own: on one connection, api.max_concurrent_streams
		// (100) would hold the changes' calls back behind the watches.
		conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			n.tb.Fatal(err)
		}
		defer conn.Close()
		stream, err := lbdv1.NewLoadBalancerServiceClient(conn).WatchServices(ctx, &lbdv1.WatchServicesRequest{})
		if err != nil {
			n.tb.Fatal(err)
		}
		go func() {
			isSynced := false
			for {
				ev, err := stream.Recv()
				if err != nil {
					w.mu.Lock()
					w.err = err
					w.mu.Unlock()
					if !isSynced {
						synced <- err
					}
					select {
					case w.cond <- struct{}{}:
					default:
					}
					return
				}
				if ev.Type == lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
					isSynced = true
					synced <- nil
					continue
				}
				w.mu.Lock()
				w.seen[ev.Service.Name] = max(w.seen[ev.Service.Name], ev.Service.Revision)
				w.mu.Unlock()
				select {
				case w.cond <- struct{}{}:
				default:
				}
			}
		}()
	}
	for range k {
		if err := <-synced; err != nil {
			n.tb.Fatalf("a watch ended before SYNCED: %v", err)
		}
	}
	start := time.Now()
	want := map[string]uint64{}
	// Each round sets other weights than the last one did, so that every call changes.
	n.rounds++
	for i := range c {
		svc := svcs[i*7919%len(svcs)]
		b := svc.Backends[i%len(svc.Backends)]
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := n.lb.UpdateBackend(cctx, &lbdv1.UpdateBackendRequest{ServiceName: svc.Name,
			Backend: &lbdv1.Backend{Address: b.Address, Port: b.Port, Weight: uint32(1 + n.rounds)}})
		ccancel()
		if err != nil {
			n.tb.Fatalf("change %d: %v", i, err)
		}
		want[svc.Name]++
	}
	// Each change raised its service's revision by one; a watcher that saw the last
	// revision of every changed service saw the changes in order (events of a service
	// arrive in commit order) and none was skipped: a skipped one is a lost event.
	base := map[string]uint64{}
	for _, s := range svcs {
		if want[s.Name] > 0 {
			base[s.Name] = n.revision(s.Name) - want[s.Name]
		}
	}
	for i, w := range ws {
		deadline := time.After(2 * time.Minute)
		for {
			w.mu.Lock()
			missing, werr := "", w.err
			for name, nrev := range want {
				if w.seen[name] < base[name]+nrev {
					missing = fmt.Sprintf("%s at revision %d (saw %d)", name, base[name]+nrev, w.seen[name])
					break
				}
			}
			w.mu.Unlock()
			if missing == "" {
				break
			}
			if werr != nil {
				n.tb.Fatalf("watcher %d ended (%v) before seeing %s", i, werr, missing)
			}
			select {
			case <-w.cond:
			case <-deadline:
				n.tb.Fatalf("watcher %d: no %s 2 minutes after the changes", i, missing)
			}
		}
	}
	r.took = time.Since(start)
	r.rssEnd, r.rssPeak = n.rssBytes(), n.procStatus("VmHWM")
	for i, w := range ws {
		w.mu.Lock()
		if w.err != nil && status.Code(w.err) != codes.Canceled {
			n.tb.Errorf("watcher %d ended: %v", i, w.err)
		}
		w.mu.Unlock()
	}
	return r
}

// revision is a service's current revision.
func (n *scaleNode) revision(name string) uint64 {
	n.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := n.lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: name})
	if err != nil {
		n.tb.Fatal(err)
	}
	return resp.Service.Revision
}
