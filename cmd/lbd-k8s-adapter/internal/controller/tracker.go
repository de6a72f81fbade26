package controller

import (
	"slices"
	"sync"
)

// tracker accumulates which Services changed between two syncs, so a sync re-translates
// only those (kube-proxy's change trackers, reduced to keys: the translation reads the
// current objects from the informers' caches).
type tracker struct {
	mu    sync.Mutex
	dirty map[string]struct{}
	all   bool
}

func newTracker() *tracker { return &tracker{dirty: map[string]struct{}{}} }

// service marks one Service ("<namespace>/<name>") for re-translation.
func (t *tracker) service(key string) {
	t.mu.Lock()
	t.dirty[key] = struct{}{}
	t.mu.Unlock()
}

// everything marks every Service, e.g. when a Node's address changed.
func (t *tracker) everything() {
	t.mu.Lock()
	t.all = true
	t.mu.Unlock()
}

// take returns and clears what changed: sorted keys, or all=true for everything.
func (t *tracker) take() (keys []string, all bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.dirty {
		keys = append(keys, k)
	}
	all = t.all
	t.dirty, t.all = map[string]struct{}{}, false
	slices.Sort(keys)
	return keys, all
}
