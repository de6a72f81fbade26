package maglev

import (
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	gomaglev "github.com/dgryski/go-maglev"
)

// BenchmarkBuild measures a full table build at M=65537. The "go-maglev"
// sub-benchmarks time go-maglev's New plus reading the table out, the floor
// Build cannot beat, so Build's own overhead (expanding, sorting, mapping to
// IDs) is the difference between the two in the same run.
func BenchmarkBuild(b *testing.B) {
	const m = 65537
	for _, n := range []int{10, 100, 1000} {
		bs := equalBackends(n)
		b.Run(fmt.Sprintf("backends=%d/Build", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Build(bs, m); err != nil {
					b.Fatal(err)
				}
			}
		})
		names := make([]string, n)
		for i, be := range bs {
			names[i] = be.Key
		}
		b.Run(fmt.Sprintf("backends=%d/go-maglev", n), func(b *testing.B) {
			b.ReportAllocs()
			sink := make([]int, m)
			for b.Loop() {
				t := gomaglev.New(names, m)
				for i := range sink {
					sink[i] = t.Lookup(uint64(i))
				}
			}
		})
	}
}

// BenchmarkGoMaglevAt10000 is go-maglev's own work for 10,000 services of 10 backends
// with 65,537-slot tables, the floor of a sync from empty at that size whatever lbd
// does around it: each op builds 1,000 tables of distinct backend sets with New (and
// reads them out) on as many goroutines as there are CPUs. It reports the CPU time per
// table (cpu-ms/table), and what 10,000 tables take, extrapolated from the 1,000 (the
// work is the same for every table): wall time on all CPUs (s/10k-tables) and CPU
// time (cpu-s/10k-tables). The baseline in the same run, one-goroutine, builds the
// same tables on one goroutine.
func BenchmarkGoMaglevAt10000(b *testing.B) {
	const m, tables, scale = 65537, 1000, 10
	names := make([][]string, tables)
	for i := range names {
		for j := range 10 {
			names[i] = append(names[i], fmt.Sprintf("198.18.%d.%d:%d", 10+j, i%250+1, 8000+i/250))
		}
	}
	for _, workers := range []int{runtime.GOMAXPROCS(0), 1} {
		name := "all-CPUs"
		if workers == 1 {
			name = "one-goroutine"
		}
		b.Run(name, func(b *testing.B) {
			cpu := cpuTime()
			for b.Loop() {
				next := make(chan int)
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						out := make([]int, m)
						for i := range next {
							t := gomaglev.New(names[i], m)
							for s := range out {
								out[s] = t.Lookup(uint64(s))
							}
						}
					})
				}
				for i := range tables {
					next <- i
				}
				close(next)
				wg.Wait()
			}
			per := (cpuTime() - cpu).Seconds() / float64(b.N)
			b.ReportMetric(per/tables*1000, "cpu-ms/table")
			b.ReportMetric(per*scale, "cpu-s/10k-tables")
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*scale, "s/10k-tables")
		})
	}
}

// cpuTime is the CPU time (user and system) of the process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
