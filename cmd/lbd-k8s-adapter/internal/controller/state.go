package controller

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	corev1 "k8s.io/api/core/v1"
)

// state is what the sync loop applied and what lbd's watch says of it, shared with the
// status writer and the Events about programming, which run in goroutines of their own.
type state struct {
	mu sync.Mutex
	// Per Service key, as of the last successful apply: the Service object translated,
	// the lbd services applied for it, and what was left out.
	translated map[string]*corev1.Service
	applied    map[string][]string
	problems   map[string][]translate.Problem
	// applies counts successful applies: 0 until lbd has been programmed once.
	applies int
	// lbd is each of our lbd services' status, from the watch; lbdSynced once the watch
	// has sent them all.
	lbd       map[string]*lbdv1.ServiceStatus
	lbdSynced bool
}

func newState() *state {
	return &state{
		translated: map[string]*corev1.Service{},
		applied:    map[string][]string{},
		problems:   map[string][]translate.Problem{},
		lbd:        map[string]*lbdv1.ServiceStatus{},
	}
}

// setApplied records a successful apply: what each Service was translated from, the
// lbd services applied (grouped by Service) and the problems per Service.
func (s *state) setApplied(translated map[string]*corev1.Service, svcs []*lbdv1.Service, problems map[string][]translate.Problem) {
	applied := map[string][]string{}
	for _, svc := range svcs {
		if key, _, ok := translate.ServiceKeyVIP(svc.Name); ok {
			applied[key] = append(applied[key], svc.Name)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.translated = maps.Clone(translated)
	s.applied = applied
	s.problems = problems
	s.applies++
}

// setLbd replaces what lbd said (after a (re)connection).
func (s *state) setLbd(statuses map[string]*lbdv1.ServiceStatus) {
	s.mu.Lock()
	s.lbd = maps.Clone(statuses)
	s.lbdSynced = true
	s.mu.Unlock()
}

// setLbdService records one service's status; nil removes it.
func (s *state) setLbdService(name string, st *lbdv1.ServiceStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == nil {
		delete(s.lbd, name)
		return
	}
	s.lbd[name] = st
}

// snapshot is a consistent copy of one Service's part of the state.
type snapshot struct {
	translated *corev1.Service
	problems   []translate.Problem
	progress   progress
}

func (s *state) snapshot(key string) snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return snapshot{translated: s.translated[key], problems: s.problems[key], progress: s.progressLocked(key)}
}

// known reports whether the state is complete: lbd applied once and its statuses read.
func (s *state) known() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applies > 0 && s.lbdSynced
}

// keys returns the Services that have lbd services applied.
func (s *state) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.applied))
}

// progress is how far lbd has programmed one Service's lbd services.
type progress struct {
	// total lbd services applied; programmed of them (noBackends of those have no usable
	// backend).
	total, programmed, noBackends int
	// errors are "name: reason" of services lbd failed to program.
	errors []string
	// done are the programmed services' names without the Service's own prefix
	// ("http/tcp/203.0.113.10"), sorted.
	done []string
	// vips are the VIPs whose every service is programmed.
	vips []netip.Addr
}

func (s *state) progressLocked(key string) progress {
	var p progress
	pendingVIP := map[netip.Addr]bool{}
	seenVIP := map[netip.Addr]bool{}
	for _, name := range s.applied[key] {
		p.total++
		_, vip, _ := translate.ServiceKeyVIP(name)
		seenVIP[vip] = true
		st := s.lbd[name]
		switch st.GetState() {
		case lbdv1.ServiceState_SERVICE_STATE_READY, lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS:
			p.programmed++
			if st.GetState() == lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS {
				p.noBackends++
			}
			p.done = append(p.done, strings.TrimPrefix(name, key+"/"))
			continue
		case lbdv1.ServiceState_SERVICE_STATE_ERROR:
			p.errors = append(p.errors, fmt.Sprintf("%s: %s", name, st.GetReason()))
		}
		pendingVIP[vip] = true
	}
	for vip := range seenVIP {
		if !pendingVIP[vip] {
			p.vips = append(p.vips, vip)
		}
	}
	slices.SortFunc(p.vips, netip.Addr.Compare)
	slices.Sort(p.done)
	return p
}

// complete reports whether every applied service is programmed.
func (p progress) complete() bool { return p.total > 0 && p.programmed == p.total }
