package health

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// listenersEnv makes the test binary a helper process serving that many
// HTTP listeners on 127.0.0.1. The benchmark probes a separate process so
// that getrusage counts the prober's CPU alone, not the servers'.
const listenersEnv = "LBD_HEALTH_BENCH_LISTENERS"

func TestMain(m *testing.M) {
	if n, err := strconv.Atoi(os.Getenv(listenersEnv)); err == nil {
		serveListeners(n)
		return
	}
	os.Exit(m.Run())
}

// serveListeners opens n listeners, prints their ports one a line, serves
// until stdin closes, then exits.
func serveListeners(n int) {
	out := bufio.NewWriter(os.Stdout)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, "listen:", err)
			os.Exit(1)
		}
		fmt.Fprintln(out, ln.Addr().(*net.TCPAddr).Port)
		srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ErrorLog: nil}
		go srv.Serve(ln)
	}
	out.Flush()
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// startListeners runs the helper process and returns its addresses.
func startListeners(b *testing.B, n int) []netip.AddrPort {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", listenersEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatalf("stdin pipe: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatalf("stdout pipe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start listener process: %v", err)
	}
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	addrs := make([]netip.AddrPort, 0, n)
	sc := bufio.NewScanner(stdout)
	for len(addrs) < n && sc.Scan() {
		port, err := strconv.ParseUint(sc.Text(), 10, 16)
		if err != nil {
			b.Fatalf("listener port %q: %v", sc.Text(), err)
		}
		addrs = append(addrs, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)))
	}
	if len(addrs) != n {
		b.Fatalf("listener process gave %d of %d ports: %v", len(addrs), n, sc.Err())
	}
	return addrs
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func totalChecks(c *Checker) uint64 {
	var n uint64
	for _, st := range c.Statuses() {
		n += st.Checks
	}
	return n
}

// BenchmarkProbe1000 measures the CPU the checker spends probing 1,000
// targets at a 1 s interval. One op is one second of probing (run with
// -benchtime Nx for N-second windows). The baseline is the same Checker with
// the same 1,000 targets and probing disabled, measured in the same run over
// an equal window. Reported: process CPU per wall second with and without
// probing (cpu-ms/s, base-cpu-ms/s), probes actually run per second, the
// CPU of one probe net of the baseline (cpu-us/probe), and the CPU of one
// probe when the same probes run back to back (seq-cpu-us/probe), which
// shows what scheduling adds on top of the probe itself.
func BenchmarkProbe1000(b *testing.B) {
	const n = 1000
	addrs := startListeners(b, n)
	for _, kind := range []Kind{KindTCP, KindHTTP} {
		b.Run(kind.String(), func(b *testing.B) {
			c := New(Options{})
			defer c.Stop()
			spec := Spec{Kind: kind, Interval: time.Second, Timeout: time.Second}
			set := func(s Spec) {
				ts := make([]Target, n)
				for i, a := range addrs {
					ts[i] = Target{Key: strconv.Itoa(i), Addr: a, Spec: s}
				}
				if err := c.Set(ts); err != nil {
					b.Fatalf("set: %v", err)
				}
			}
			window := time.Duration(b.N) * time.Second
			measure := func() (cpuPerSec float64, wall time.Duration) {
				cpu0, t0 := cpuTime(b), time.Now()
				time.Sleep(window)
				cpu1, t1 := cpuTime(b), time.Now()
				return float64(cpu1-cpu0) / float64(time.Millisecond) / t1.Sub(t0).Seconds(), t1.Sub(t0)
			}

			b.StopTimer()
			set(Spec{})
			time.Sleep(200 * time.Millisecond)
			base, _ := measure()

			set(spec)
			// Every target's first probe falls within one interval.
			time.Sleep(1500 * time.Millisecond)
			checks0 := totalChecks(c)
			b.StartTimer()
			probing, wall := measure()
			b.StopTimer()
			probesPerSec := float64(totalChecks(c)-checks0) / wall.Seconds()

			for _, st := range c.Statuses() {
				if st.State != Up {
					b.Fatalf("target %s is %v (%s): the figures would not be for passing probes", st.Key, st.State, st.Last.Err)
				}
			}
			if probesPerSec < 0.8*n {
				b.Fatalf("only %.0f probes/s for %d targets at 1 s", probesPerSec, n)
			}
			// Reference: the same probes run back to back in one goroutine,
			// with no scheduling, in the same run. On loopback most of a
			// probe's CPU is the kernel's work for both ends of the
			// connection.
			set(Spec{})
			const seqProbes = 3000
			probers := make([]prober, n)
			for i, a := range addrs {
				tg := Target{Key: "seq", Addr: a, Spec: spec.WithDefaults()}
				p, err := newProber(tg, nil)
				if err != nil {
					b.Fatalf("new prober: %v", err)
				}
				probers[i] = p
			}
			cpu0 := cpuTime(b)
			for i := range seqProbes {
				if r := runProbe(context.Background(), probers[i%n], time.Second); !r.OK {
					b.Fatalf("sequential probe: %s", r.Err)
				}
			}
			seq := float64(cpuTime(b)-cpu0) / float64(time.Microsecond) / seqProbes

			b.ReportMetric(probing, "cpu-ms/s")
			b.ReportMetric(base, "base-cpu-ms/s")
			b.ReportMetric(probesPerSec, "probes/s")
			b.ReportMetric((probing-base)*1000/probesPerSec, "cpu-us/probe")
			b.ReportMetric(seq, "seq-cpu-us/probe")
		})
	}
}
