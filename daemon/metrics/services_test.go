package metrics

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/servicematch"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// fleet answers as the datapath and the store do for the services it holds, in an
// order that changes at each call (the choice of services must not depend on it). Each
// read of the counters counts one more packet for every service.
type fleet struct {
	names []string
	reads uint64
}

func (f *fleet) shuffled() []string {
	out := slices.Clone(f.names)
	k := int(f.reads) % max(len(out), 1)
	return append(out[k:], out[:k]...)
}

func (f *fleet) stats(func(string) bool) (*lbdv1.GetStatsResponse, error) {
	f.reads++
	resp := &lbdv1.GetStatsResponse{}
	for _, n := range f.shuffled() {
		resp.Services = append(resp.Services, &lbdv1.ServiceStats{ServiceName: n, Packets: 1000 + f.reads})
	}
	return resp, nil
}

// status: every service ready with 2 backends up, but those whose name ends in 7,
// with none usable and one down.
func (f *fleet) status(func(string) bool) []store.StatusCounts {
	var out []store.StatusCounts
	for _, n := range f.shuffled() {
		c := store.StatusCounts{Name: n, State: lbdv1.ServiceState_SERVICE_STATE_READY, Usable: 2, Up: 2, Advertised: true}
		if strings.HasSuffix(n, "7") {
			c = store.StatusCounts{Name: n, State: lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS, Down: 1}
		}
		out = append(out, c)
	}
	return out
}

func names(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// servicesWithSeries returns the services that have each of the 9 per-service series in
// a scrape, and fails if one has some of them only.
func servicesWithSeries(t *testing.T, out string) []string {
	t.Helper()
	per := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "lbd_service_") {
			i := strings.Index(l, `service="`)
			per[l[i+9:i+9+strings.IndexByte(l[i+9:], '"')]]++
		}
	}
	var got []string
	for n, k := range per {
		if k != 9 {
			t.Errorf("service %s has %d per-service series, want 9", n, k)
		}
		got = append(got, n)
	}
	slices.Sort(got)
	return got
}

// TestServiceSeriesLimit: every service has its series up to the limit; above it only
// the selected ones, the first by name up to the limit, the same at every scrape; the
// node-level series count every service, and the services left out are counted and
// logged once per change.
func TestServiceSeriesLimit(t *testing.T) {
	selected, err := servicematch.Compile([]string{"b-*", "a-3"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{names: append(names("a", 10), names("b", 10)...)}
	var logged bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})
	build := func(s ServiceSeries) *Metrics {
		m := New(f.stats, Options{LB: true, Services: s, Log: log})
		m.AddStatus(f.status)
		return m
	}
	node := func(out string) {
		t.Helper()
		for _, want := range []string{
			`lbd_services{state="ready"} 18`, `lbd_services{state="no_backends"} 2`, `lbd_services{state="pending"} 0`,
			`lbd_services_advertisement{state="withdrawn"} 2`, `lbd_services_backends{health="up"} 36`,
			`lbd_services_backends{health="down"} 2`, `lbd_services_usable_backends 36`,
		} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("scrape lacks %s", want)
			}
		}
	}

	for _, limit := range []int{0, 20} {
		out := scrape(t, build(ServiceSeries{Limit: limit, Services: selected}))
		if got := servicesWithSeries(t, out); len(got) != 20 {
			t.Errorf("limit %d, 20 services: series for %d services, want all", limit, len(got))
		}
		if !strings.Contains(out, "lbd_metrics_services_omitted 0\n") {
			t.Errorf("limit %d: omitted is not 0:\n%s", limit, grep(out, "omitted"))
		}
		node(out)
	}
	if logged.Len() > 0 {
		t.Errorf("logged with no service left out:\n%s", logged.String())
	}

	m := build(ServiceSeries{Limit: 5, Services: selected})
	for i := range 3 {
		out := scrape(t, m)
		if got, want := servicesWithSeries(t, out), []string{"a-3", "b-0", "b-1", "b-2", "b-3"}; !slices.Equal(got, want) {
			t.Errorf("scrape %d: series for %v, want %v", i, got, want)
		}
		if !strings.Contains(out, "lbd_metrics_services_omitted 15\n") {
			t.Errorf("scrape %d: %s, want 15", i, grep(out, "lbd_metrics_services_omitted "))
		}
		node(out)
		// 20 services, each 1 packet more at each read since the first.
		if want := fmt.Sprintf("lbd_services_packets_total %d\n", 20*i); !strings.Contains(out, want) {
			t.Errorf("scrape %d: %s, want %s", i, grep(out, "lbd_services_packets_total "), want)
		}
	}
	if n := strings.Count(logged.String(), "[WARN]"); n != 1 || !strings.Contains(logged.String(), "omitted=15") {
		t.Errorf("3 scrapes with 15 left out logged %d warnings, want 1:\n%s", n, logged.String())
	}

	// Nothing selected: no service has series above the limit.
	if got := servicesWithSeries(t, scrape(t, build(ServiceSeries{Limit: 5}))); len(got) != 0 {
		t.Errorf("nothing selected: series for %v", got)
	}

	logged.Reset()
	f.names = f.names[:19]
	scrape(t, m)
	f.names = f.names[:5]
	out := scrape(t, m)
	if got := servicesWithSeries(t, out); len(got) != 5 {
		t.Errorf("5 services at limit 5: series for %v", got)
	}
	if n := strings.Count(logged.String(), "[WARN]"); n != 1 || !strings.Contains(logged.String(), "omitted=14") ||
		!strings.Contains(logged.String(), "[INFO]") {
		t.Errorf("omitted 15 → 14 → 0 logged:\n%s", logged.String())
	}
}

// TestLBTotals: the node totals grow by what each service's counters add, and never
// fall when a service is removed or created again.
func TestLBTotals(t *testing.T) {
	var l lbTotals
	read := func(kv ...any) uint64 {
		var ss []*lbdv1.ServiceStats
		for i := 0; i < len(kv); i += 2 {
			ss = append(ss, &lbdv1.ServiceStats{ServiceName: kv[i].(string), Packets: uint64(kv[i+1].(int))})
		}
		return l.add(ss).packets
	}
	for i, c := range []struct {
		read uint64
		want uint64
		why  string
	}{
		{read("a", 100, "b", 50), 0, "counted from the first read"},
		{read("a", 110, "b", 55), 15, "both grew"},
		{read("a", 120), 25, "b removed: what it added stays"},
		{read("a", 5, "c", 1000), 30, "a created again (counters from 0), c new"},
		{read("a", 7, "c", 1010), 42, "both grew"},
		{read(), 42, "every service removed"},
		{read("b", 9), 42, "b again, counted from this read"},
		{read("b", 10), 43, "b grew"},
	} {
		if c.read != c.want {
			t.Errorf("read %d (%s): total %d, want %d", i, c.why, c.read, c.want)
		}
	}
}

// TestDefaultLimitBound: at the default limit (2,000 services, config's
// DefaultServiceSeriesLimit) with service names of 60 characters and the counters of a
// busy node, the scrape stays under the bounds docs/operations.md gives: 20,000 series
// and 2 MiB; one service more and only the node-level series are left.
func TestDefaultLimitBound(t *testing.T) {
	const limit, nameLen = 2000, 60
	for _, services := range []int{limit, limit + 1} {
		var names []string
		for i := range services {
			n := fmt.Sprintf("namespace-%05d/service-name", i)
			names = append(names, n+strings.Repeat("x", nameLen-len(n)))
		}
		stats := func(func(string) bool) (*lbdv1.GetStatsResponse, error) {
			resp := &lbdv1.GetStatsResponse{}
			for _, n := range names {
				resp.Services = append(resp.Services, &lbdv1.ServiceStats{ServiceName: n, Packets: 123456789012, Bytes: 123456789012345, NewFlows: 1234567890})
			}
			return resp, nil
		}
		m := New(stats, Options{LB: true, Services: ServiceSeries{Limit: limit}})
		m.AddStatus(func(func(string) bool) []store.StatusCounts {
			var out []store.StatusCounts
			for _, n := range names {
				out = append(out, store.StatusCounts{Name: n, State: lbdv1.ServiceState_SERVICE_STATE_READY, Usable: 10, Up: 10, Advertised: true})
			}
			return out
		})
		out := scrape(t, m)
		series := 0
		for _, l := range strings.Split(out, "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				series++
			}
		}
		t.Logf("%d services: %d series, %d bytes", services, series, len(out))
		if series >= 20000 || len(out) >= 2<<20 {
			t.Errorf("%d services: %d series, %d bytes; want < 20,000 and < 2 MiB", services, series, len(out))
		}
		if services > limit && series > 150 {
			t.Errorf("%d services, above the limit: %d series, want the node-level ones only", services, series)
		}
	}
}
