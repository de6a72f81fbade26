package maglev

import (
	"fmt"
	"testing"

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
