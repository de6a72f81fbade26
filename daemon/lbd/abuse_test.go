package lbd_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// An lbd under abuse: clients that send oversized requests, clients far above the rate
// limit, and streams whose clients never read, while one legitimate client makes calls.
// BenchmarkAPIUnderAbuse measures the legitimate client's latency and lbd's memory;
// TestAPIUnderAbuse runs the same scene smaller and checks each abuse met its limit.

// Limits of the scene: small enough that every abuse meets them quickly.
const (
	// A small limit keeps the abusers' own cost of sending oversized requests low:
	// they share the machine's CPUs with lbd and the legitimate client.
	abuseMaxRecv     = 128 << 10 // api.max_recv_msg_bytes
	abuseOversize    = 256 << 10 // what oversized clients send
	abuseRate        = 200       // api.rate_limit.rate and burst, per principal (the default rate)
	abuseSendTimeout = time.Second
	abuseServices    = 2000                 // a watch snapshot far larger than a stream's window
	legitInterval    = 6 * time.Millisecond // below the rate limit
)

type abuseEnv struct {
	p       *proc
	addr    string
	metrics string
	roots   *x509.CertPool
	legit   tls.Certificate
	// The abusers' process gets the CA and their certificate in PEM form.
	caPEM, abuserCert, abuserKey []byte
}

func startAbuseEnv(tb testing.TB) *abuseEnv {
	f := newTLSFixture(tb)
	in := newInstance(tb)
	dir := filepath.Dir(in.socket)
	e := &abuseEnv{addr: freePort(tb), metrics: freePort(tb), roots: x509.NewCertPool()}
	e.roots.AddCert(f.ca.Cert)
	e.caPEM = f.ca.PEM
	e.abuserCert, e.abuserKey = principalCertPEM(tb, f.ca, "spiffe://lbd.test/abuser", pkix.Name{CommonName: "abuser"})
	e.legit = principalCert(tb, f.ca, "spiffe://lbd.test/legit", pkix.Name{CommonName: "legit"})
	policy := writeFile(tb, dir, "policy.yaml", []byte("rules:\n  - role: reader\n    principals: [\"spiffe://lbd.test/abuser\", \"spiffe://lbd.test/legit\"]\n"))
	cfg := writeFile(tb, dir, "lbd.yaml", fmt.Appendf(nil, "api:\n  policy_file: %s\n  max_recv_msg_bytes: %d\n  stream_send_timeout: %s\n"+
		"  rate_limit:\n    rate: %d\n    burst: %d\n", policy, abuseMaxRecv, abuseSendTimeout, abuseRate, abuseRate))
	var admin *grpc.ClientConn
	e.p, admin = startLBD(tb, in, append(f.args(e.addr), "--config", cfg, "--metrics-listen", e.metrics)...)
	// In applies of 250 services, each below the scene's request size limit.
	svcs := map[string][]*lbdv1.Service{}
	for i := range abuseServices {
		owner := fmt.Sprintf("bench-%d", i/250)
		svcs[owner] = append(svcs[owner], &lbdv1.Service{Name: fmt.Sprintf("svc-%04d", i), Owner: owner, Vip: fmt.Sprintf("203.0.113.%d", 1+i%250),
			Port: uint32(1000 + i/250), Protocol: lbdv1.Protocol_PROTOCOL_TCP,
			Backends: []*lbdv1.Backend{{Address: fmt.Sprintf("198.18.%d.%d", 1+i/250, 1+i%250), Port: 8080, NodeAddress: "198.18.0.2", Weight: 1}}})
	}
	for owner, ss := range svcs {
		if _, err := lbdv1.NewLoadBalancerServiceClient(admin).ApplyServices(ctxT(tb), &lbdv1.ApplyServicesRequest{Owner: owner, Services: ss}); err != nil {
			tb.Fatalf("create %d services of %s: %v", len(ss), owner, err)
		}
	}
	return e
}

// dial returns a TCP client with cert. A fixed window turns off gRPC's window
// growth, so a client that does not read stops the server's sends at 64 KiB.
func (e *abuseEnv) dial(tb testing.TB, cert tls.Certificate, opts ...grpc.DialOption) *grpc.ClientConn {
	conn, err := grpc.NewClient(e.addr, append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: e.roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}})))...)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// legitCall is the legitimate client's call, timed.
func legitCall(tb testing.TB, lb lbdv1.LoadBalancerServiceClient) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: "svc-0001"}); err != nil {
		tb.Fatalf("the legitimate client's call failed: %v", err)
	}
	return time.Since(start)
}

// paced makes calls every legitInterval, as long as more returns true.
func paced(tb testing.TB, lb lbdv1.LoadBalancerServiceClient, more func() bool) []time.Duration {
	t := time.NewTicker(legitInterval)
	defer t.Stop()
	var lat []time.Duration
	for more() {
		<-t.C
		lat = append(lat, legitCall(tb, lb))
	}
	return lat
}

func percentile(lat []time.Duration, p float64) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// rssKB reads a field (VmRSS, VmHWM) of lbd's /proc status, in KiB.
func rssKB(tb testing.TB, pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatalf("read lbd's status: %v", err)
	}
	m := regexp.MustCompile(field + `:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		tb.Fatalf("no %s in lbd's status", field)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// cpuSeconds is the CPU time lbd has used (user and system).
func cpuSeconds(tb testing.TB, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatalf("read lbd's stat: %v", err)
	}
	// Fields after the command's closing parenthesis: utime and stime are the 12th and
	// 13th, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

// metric returns the sum of a counter's series on lbd's /metrics.
func (e *abuseEnv) metric(tb testing.TB, name string) float64 {
	res, err := http.Get("http://" + e.metrics + "/metrics")
	if err != nil {
		tb.Fatalf("scrape: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// checkAbuse fails unless each kind of abuse met its limit and only it.
func (e *abuseEnv) checkAbuse(tb testing.TB, r abuserResult, kinds []int) {
	for _, u := range r.Unexpected {
		tb.Errorf("abuser: unexpected answer %s", u)
	}
	for _, k := range kinds {
		switch {
		case k == kindOversized && r.Oversized == 0:
			tb.Errorf("no oversized request was refused with RESOURCE_EXHAUSTED")
		case k == kindFlood && (r.Limited == 0 || e.metric(tb, "lbd_api_rate_limited_total") == 0):
			tb.Errorf("the flood was not rate-limited (%d refusals seen, lbd_api_rate_limited_total %g)", r.Limited, e.metric(tb, "lbd_api_rate_limited_total"))
		case k == kindUnread && (r.Streams == 0 || e.metric(tb, "lbd_api_stalled_streams_total") == 0):
			tb.Errorf("lbd ended no stream that was not read (%d opened, lbd_api_stalled_streams_total %g)", r.Streams, e.metric(tb, "lbd_api_stalled_streams_total"))
		}
	}
}

// TestAPIUnderAbuse: with 24 abusive clients, the legitimate client's calls all
// succeed, oversized requests and floods are refused with RESOURCE_EXHAUSTED, and
// streams that are not read are ended. (BenchmarkAPIUnderAbuse measures the latency.)
func TestAPIUnderAbuse(t *testing.T) {
	e := startAbuseEnv(t)
	stop := e.abuse(t, 24, allKinds)
	lb := lbdv1.NewLoadBalancerServiceClient(e.dial(t, e.legit))
	// At least three send timeouts, then until every abuse has met its limit (a loaded
	// machine can take longer), for at most a minute.
	end, giveUp := time.Now().Add(3*abuseSendTimeout), time.Now().Add(time.Minute)
	lat := paced(t, lb, func() bool {
		if time.Now().Before(end) {
			return true
		}
		met := e.metric(t, "lbd_api_rate_limited_total") > 0 && e.metric(t, "lbd_api_stalled_streams_total") > 0
		return !met && time.Now().Before(giveUp)
	})
	e.checkAbuse(t, stop(), allKinds)
	t.Logf("legitimate client: %d calls, p50 %v, p99 %v; lbd peak RSS %.0f MiB", len(lat), percentile(lat, 0.5), percentile(lat, 0.99),
		rssKB(t, e.p.cmd.Process.Pid, "VmHWM")/1024)
}

// BenchmarkAPIUnderAbuse: one legitimate client's calls (every 6 ms) while 200 clients
// abuse the API (all: a third of each kind; then 200 of one kind), against the same
// client's calls before the abuse. Reports the p50 and p99 latencies, the p99's ratio
// to the baseline, the CPUs lbd used meanwhile, and its RSS.
func BenchmarkAPIUnderAbuse(b *testing.B) {
	for _, tc := range []struct {
		name  string
		kinds []int
	}{
		{"all", allKinds},
		{"oversized", []int{kindOversized}},
		{"flood", []int{kindFlood}},
		{"unread", []int{kindUnread}},
	} {
		b.Run(tc.name, func(b *testing.B) { benchAbuse(b, 200, tc.kinds) })
	}
}

func benchAbuse(b *testing.B, n int, kinds []int) {
	e := startAbuseEnv(b)
	lb := lbdv1.NewLoadBalancerServiceClient(e.dial(b, e.legit))
	i := 0
	base := paced(b, lb, func() bool { i++; return i <= 300 })
	rssBefore := rssKB(b, e.p.cmd.Process.Pid, "VmRSS")
	stop := e.abuse(b, n, kinds)
	time.Sleep(abuseSendTimeout) // every abuser at work, the first streams stalled
	var lat []time.Duration
	cpu0, wall0 := cpuSeconds(b, e.p.cmd.Process.Pid), time.Now()
	t := time.NewTicker(legitInterval)
	for b.Loop() {
		<-t.C
		lat = append(lat, legitCall(b, lb))
	}
	t.Stop()
	lbdCPU := (cpuSeconds(b, e.p.cmd.Process.Pid) - cpu0) / time.Since(wall0).Seconds()
	rss, peak := rssKB(b, e.p.cmd.Process.Pid, "VmRSS"), rssKB(b, e.p.cmd.Process.Pid, "VmHWM")
	e.checkAbuse(b, stop(), kinds)
	p99, baseP99 := percentile(lat, 0.99), percentile(base, 0.99)
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(baseP99.Microseconds())/1000, "baseline-p99-ms")
	b.ReportMetric(float64(p99)/float64(baseP99), "p99/baseline")
	b.ReportMetric(lbdCPU, "lbd-cpus")
	b.ReportMetric(rssBefore/1024, "rss-before-MiB")
	b.ReportMetric(rss/1024, "rss-MiB")
	b.ReportMetric(peak/1024, "peak-rss-MiB")
}
