package controller

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/ipam"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Annotations a LoadBalancer Service may carry.
const (
	// AnnotationPool names the address pool a Service wants its VIPs from.
	AnnotationPool = "lbd-dev.github.io/address-pool"
	// AnnotationIPs asks for specific VIPs, at most one per family, comma-separated
	// ("203.0.113.10,2001:db8:ff::10"); it takes precedence over spec.loadBalancerIP,
	// which Kubernetes deprecates and which holds one address only.
	AnnotationIPs = "lbd-dev.github.io/load-balancer-ips"
)

// statusWorkers is how many status writes run at once: the client's rate limit, not
// this, bounds the load on the API server; it only hides each write's round trip.
const statusWorkers = 16

// statusWriter keeps the status of our LoadBalancer Services: the ingress IPs allocated
// from the pools, and the conditions. Every replica runs one, but only the Lease holder
// writes: two writers of status would fight.
type statusWriter struct {
	c        *controller
	pools    []*ipam.Pool
	election config.LeaderElection
	runner   *Runner
	// Events of the previous run (see emit).
	emitted map[ipam.Event]bool
}

func newStatusWriter(c *controller, pools []*ipam.Pool, cfg *config.Config) *statusWriter {
	w := &statusWriter{c: c, pools: pools, election: cfg.LeaderElection, emitted: map[ipam.Event]bool{}}
	// The runner runs only while leading (see run); a trigger before that is kept.
	w.runner = NewRunner(w.writeOnce, cfg.Sync.MinInterval.Duration, cfg.Sync.MaxInterval.Duration)
	return w
}

// run campaigns for the Lease until ctx is done, and writes status while it holds it.
func (w *statusWriter) run(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta: metav1.ObjectMeta{Namespace: w.election.Namespace, Name: w.election.Name},
		Client:    w.c.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{
			Identity:      w.c.identity,
			EventRecorder: w.c.recorder,
		},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   w.election.LeaseDuration.Duration,
			RenewDeadline:   w.election.RenewDeadline.Duration,
			RetryPeriod:     w.election.RetryPeriod.Duration,
			ReleaseOnCancel: true,
			Name:            w.election.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					w.c.log.Info("leading: writing Service status", "op", "elect", "identity", w.c.identity, "pools", len(w.pools))
					clear(w.emitted)
					w.runner.Run(ctx)
				},
				OnStoppedLeading: func() {
					w.c.log.Info("not leading", "op", "elect", "identity", w.c.identity)
				},
			},
		})
	}
}

// statusWrite is one Service's new status.
type statusWrite struct {
	svc            *corev1.Service
	status         corev1.ServiceStatus
	ingressChanged bool
}

// writeOnce plans every Service's ingress IPs, works out its conditions, and writes the
// statuses that change, new ingress IPs first.
func (w *statusWriter) writeOnce(ctx context.Context) error {
	all, err := w.c.services.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	var owned []*corev1.Service
	for _, s := range all {
		if translate.OwnsLoadBalancer(s, w.c.opts) {
			owned = append(owned, s)
		}
	}
	decisions := map[string]ipam.Decision{}
	if len(w.pools) > 0 {
		byKey := map[string]*corev1.Service{}
		reqs := make([]ipam.Request, 0, len(owned))
		for _, s := range owned {
			key := s.Namespace + "/" + s.Name
			byKey[key] = s
			reqs = append(reqs, w.request(key, s))
		}
		ds, events := ipam.Plan(reqs, w.pools)
		for _, d := range ds {
			decisions[d.Key] = d
		}
		w.emit(events, byKey)
	}
	var writes []statusWrite
	for _, s := range owned {
		key := s.Namespace + "/" + s.Name
		st := s.Status.DeepCopy()
		ingress := ingressIPs(s)
		d, planned := decisions[key]
		if planned {
			if !slices.Equal(d.IPs, ingress) {
				st.LoadBalancer.Ingress = ingressOf(d.IPs)
				ingress = d.IPs
			}
			setCondition(st, s, allocatedCondition(d))
		}
		snap := w.c.state.snapshot(key)
		setCondition(st, s, acceptedCondition(snap))
		setCondition(st, s, programmedCondition(s, ingress, snap, w.c.identity))
		if !equality.Semantic.DeepEqual(&s.Status, st) {
			writes = append(writes, statusWrite{svc: s, status: *st, ingressChanged: planned && d.Changed})
		}
	}
	// New VIPs first: a Service waits for its address, not for another's condition.
	slices.SortStableFunc(writes, func(a, b statusWrite) int {
		if a.ingressChanged == b.ingressChanged {
			return 0
		}
		if a.ingressChanged {
			return -1
		}
		return 1
	})
	return w.write(ctx, writes)
}

// write runs the status writes statusWorkers at a time.
func (w *statusWriter) write(ctx context.Context, writes []statusWrite) error {
	var mu sync.Mutex
	var errs []error
	todo := make(chan statusWrite)
	var wg sync.WaitGroup
	for range min(statusWorkers, len(writes)) {
		wg.Go(func() {
			for wr := range todo {
				if err := w.writeStatus(ctx, wr); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, wr := range writes {
		if ctx.Err() != nil {
			break
		}
		todo <- wr
	}
	close(todo)
	wg.Wait()
	if len(errs) > 0 {
		// One line per run: a conflict with a newer version is retried by the next run.
		return fmt.Errorf("%d of %d status writes failed, the first: %w", len(errs), len(writes), errs[0])
	}
	return nil
}

// writeStatus writes a Service's status. It works on the informer's copy, whose
// resourceVersion makes a write based on stale state fail (and be retried) rather than win.
func (w *statusWriter) writeStatus(ctx context.Context, wr statusWrite) error {
	s := wr.svc.DeepCopy()
	s.Status = wr.status
	if _, err := w.c.kube.CoreV1().Services(s.Namespace).UpdateStatus(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of service %s/%s: %w", s.Namespace, s.Name, err)
	}
	if wr.ingressChanged {
		w.c.log.Info("ingress IPs written", "op", "allocate", "service", s.Namespace+"/"+s.Name, "ips", ingressIPs(s))
	}
	return nil
}

// request describes a Service to the allocator.
func (w *statusWriter) request(key string, s *corev1.Service) ipam.Request {
	r := ipam.Request{
		Key:              key,
		Created:          s.CreationTimestamp.Time,
		Pool:             s.Annotations[AnnotationPool],
		Current:          ingressIPs(s),
		RequireDualStack: s.Spec.IPFamilyPolicy != nil && *s.Spec.IPFamilyPolicy == corev1.IPFamilyPolicyRequireDualStack,
		Programmed:       w.c.state.snapshot(key).progress.vips,
	}
	for _, f := range s.Spec.IPFamilies {
		r.Families = append(r.Families, f == corev1.IPv4Protocol)
	}
	if len(r.Families) == 0 {
		r.Families = []bool{true}
	}
	r.Wanted, r.WantedError = wanted(s)
	if w.c.opts.ExternalIPs {
		for _, ip := range s.Spec.ExternalIPs {
			if a, err := netip.ParseAddr(ip); err == nil && w.c.opts.ExternalIPPool(a.Unmap()) != "" {
				r.Reserved = append(r.Reserved, a.Unmap())
			}
		}
	}
	return r
}

// wanted reads the addresses a Service asks for: the annotation, else
// spec.loadBalancerIP.
func wanted(s *corev1.Service) ([]netip.Addr, string) {
	field, raw := "spec.loadBalancerIP", s.Spec.LoadBalancerIP
	if v, ok := s.Annotations[AnnotationIPs]; ok {
		field, raw = "annotation "+AnnotationIPs, v
	}
	var out []netip.Addr
	for part := range strings.SplitSeq(raw, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Sprintf("%s: %q is not an IP address", field, part)
		}
		a = a.Unmap()
		if slices.ContainsFunc(out, func(b netip.Addr) bool { return b.Is4() == a.Is4() }) {
			return nil, fmt.Sprintf("%s: %q asks for two addresses of one family", field, raw)
		}
		out = append(out, a)
	}
	return out, ""
}

// emit records the allocator's events on their Services. An event that the previous run
// also produced is not repeated, so a lasting problem ("pool exhausted") is said once, and
// again only if it goes away and comes back.
func (w *statusWriter) emit(events []ipam.Event, byKey map[string]*corev1.Service) {
	current := map[ipam.Event]bool{}
	for _, e := range events {
		current[e] = true
		if w.emitted[e] || byKey[e.Key] == nil {
			continue
		}
		typ := corev1.EventTypeNormal
		if e.Warning {
			typ = corev1.EventTypeWarning
		}
		w.c.recorder.Event(byKey[e.Key], typ, e.Reason, e.Message)
	}
	w.emitted = current
}

func ingressIPs(s *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func ingressOf(ips []netip.Addr) []corev1.LoadBalancerIngress {
	mode := corev1.LoadBalancerIPModeVIP
	out := make([]corev1.LoadBalancerIngress, 0, len(ips))
	for _, ip := range ips {
		out = append(out, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: &mode})
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
