package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/ipam"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// AnnotationPool names the address pool a LoadBalancer Service wants its VIP from.
const AnnotationPool = "lbd-dev.github.io/address-pool"

// allocator gives LoadBalancer Services without an ingress IP one from the pools. Every
// replica runs one, but only the Lease holder acts: two writers of status would fight.
type allocator struct {
	c        *controller
	pools    []*ipam.Pool
	election config.LeaderElection
	identity string
	runner   *Runner
	// Events of the previous run (see emit).
	emitted map[ipam.Event]bool
}

func newAllocator(c *controller, pools []*ipam.Pool, cfg *config.Config, identity string) *allocator {
	a := &allocator{c: c, pools: pools, election: cfg.LeaderElection, identity: identity, emitted: map[ipam.Event]bool{}}
	// The runner runs only while leading (see run); a trigger before that is kept.
	a.runner = NewRunner(a.allocateOnce, cfg.Sync.MinInterval.Duration, cfg.Sync.MaxInterval.Duration)
	return a
}

// run campaigns for the Lease until ctx is done, and allocates while it holds it.
func (a *allocator) run(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta: metav1.ObjectMeta{Namespace: a.election.Namespace, Name: a.election.Name},
		Client:    a.c.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{
			Identity:      a.identity,
			EventRecorder: a.c.recorder,
		},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   a.election.LeaseDuration.Duration,
			RenewDeadline:   a.election.RenewDeadline.Duration,
			RetryPeriod:     a.election.RetryPeriod.Duration,
			ReleaseOnCancel: true,
			Name:            a.election.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					a.c.log.Info("leading: allocating VIPs", "op", "elect", "identity", a.identity)
					clear(a.emitted)
					a.runner.Run(ctx)
				},
				OnStoppedLeading: func() {
					a.c.log.Info("not leading", "op", "elect", "identity", a.identity)
				},
			},
		})
	}
}

// allocateOnce plans every Service's ingress IPs and writes the ones that change.
func (a *allocator) allocateOnce(ctx context.Context) error {
	svcs, err := a.c.services.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	byKey := map[string]*corev1.Service{}
	var reqs []ipam.Request
	for _, s := range svcs {
		if !translate.OwnsLoadBalancer(s, a.c.opts) {
			continue
		}
		key := s.Namespace + "/" + s.Name
		byKey[key] = s
		reqs = append(reqs, request(key, s))
	}
	decisions, events := ipam.Plan(reqs, a.pools)
	var errs []error
	for _, d := range decisions {
		if !d.Changed {
			continue
		}
		if err := a.writeStatus(ctx, byKey[d.Key], d.IPs); err != nil {
			errs = append(errs, err)
		}
	}
	a.emit(events, byKey)
	return errors.Join(errs...)
}

// request describes a Service to the allocator.
func request(key string, s *corev1.Service) ipam.Request {
	r := ipam.Request{Key: key, Created: s.CreationTimestamp.Time, Pool: s.Annotations[AnnotationPool]}
	for _, f := range s.Spec.IPFamilies {
		r.Families = append(r.Families, f == corev1.IPv4Protocol)
	}
	if len(r.Families) == 0 {
		r.Families = []bool{true}
	}
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(ing.IP); err == nil {
			r.Current = append(r.Current, ip)
		}
	}
	if ip, err := netip.ParseAddr(s.Spec.LoadBalancerIP); err == nil {
		r.Wanted = append(r.Wanted, ip)
	}
	return r
}

// writeStatus sets a Service's ingress IPs. It works on the informer's copy, whose
// resourceVersion makes a write based on stale state fail (and be retried) rather than win.
func (a *allocator) writeStatus(ctx context.Context, svc *corev1.Service, ips []netip.Addr) error {
	s := svc.DeepCopy()
	mode := corev1.LoadBalancerIPModeVIP
	s.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: &mode})
	}
	if _, err := a.c.kube.CoreV1().Services(s.Namespace).UpdateStatus(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of service %s/%s: %w", s.Namespace, s.Name, err)
	}
	a.c.log.Info("ingress IPs written", "op", "allocate", "service", s.Namespace+"/"+s.Name, "ips", ips)
	return nil
}

// emit records the allocator's events on their Services. An event that the previous run
// also produced is not repeated, so a lasting problem ("pool exhausted") is said once, and
// again only if it goes away and comes back.
func (a *allocator) emit(events []ipam.Event, byKey map[string]*corev1.Service) {
	current := map[ipam.Event]bool{}
	for _, e := range events {
		current[e] = true
		if a.emitted[e] || byKey[e.Key] == nil {
			continue
		}
		typ := corev1.EventTypeNormal
		if e.Warning {
			typ = corev1.EventTypeWarning
		}
		a.c.recorder.Event(byKey[e.Key], typ, e.Reason, e.Message)
	}
	a.emitted = current
}
