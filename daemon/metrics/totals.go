package metrics

import (
	"sync"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// counts are a service's packets, bytes and new flows.
type counts struct{ packets, bytes, flows uint64 }

func (c counts) add(d counts) counts {
	return counts{c.packets + d.packets, c.bytes + d.bytes, c.flows + d.flows}
}

func (c counts) sub(d counts) counts {
	return counts{c.packets - d.packets, c.bytes - d.bytes, c.flows - d.flows}
}

func (c counts) below(d counts) bool {
	return c.packets < d.packets || c.bytes < d.bytes || c.flows < d.flows
}

// lbTotals sums the LB datapath's service counters into node totals that only grow, as
// Prometheus counters must: summed as they are, the totals would fall each time a
// service is removed (its counters go) or created again (its counters start at 0),
// and a rate() over them would read each fall as a counter reset and show a burst of
// traffic that never was. So the totals count what each service's counters added while
// lbd watched: from the first scrape that saw the service (after a restart, from the
// first scrape of the new lbd) until the last one that saw it.
type lbTotals struct {
	mu   sync.Mutex
	gen  uint64
	seen map[string]*watched
	gone counts // what services no longer there added while watched
}

type watched struct {
	base, last counts
	gen        uint64
}

// add takes a read of every service's counters and returns the node totals.
func (l *lbTotals) add(services []*lbdv1.ServiceStats) counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = make(map[string]*watched, len(services))
	}
	l.gen++
	for _, s := range services {
		c := counts{s.Packets, s.Bytes, s.NewFlows}
		w := l.seen[s.ServiceName]
		switch {
		case w == nil:
			w = &watched{base: c}
			l.seen[s.ServiceName] = w
		case c.below(w.last):
			// Removed and created again between two scrapes: its counters started at 0.
			l.gone = l.gone.add(w.last.sub(w.base))
			w.base = counts{}
		}
		w.last, w.gen = c, l.gen
	}
	sum := l.gone
	for name, w := range l.seen {
		if w.gen != l.gen {
			l.gone = l.gone.add(w.last.sub(w.base))
			sum = sum.add(w.last.sub(w.base))
			delete(l.seen, name)
			continue
		}
		sum = sum.add(w.last.sub(w.base))
	}
	return sum
}
