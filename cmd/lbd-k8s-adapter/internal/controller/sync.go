package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
)

// maxRejections bounds how many services or backends one sync leaves out because lbd
// refused them, each costing one more ApplyServices call.
const maxRejections = 100

// syncOnce re-translates the Services that changed and applies the owner's whole set.
// Whatever lbd refuses (a service or one backend: the error names it) is left out and the
// rest applied again, so one bad object never stops the cluster's other changes.
func (c *controller) syncOnce(ctx context.Context) error {
	c.health.syncStarted()
	err := c.reconcile(ctx)
	c.health.syncEnded(err)
	return err
}

func (c *controller) reconcile(ctx context.Context) error {
	keys, all := c.tracker.take()
	if all {
		c.nodeAddrs = translate.NodeAddresses{}
		nodes, err := c.nodes.List(labels.Everything())
		if err != nil {
			return fmt.Errorf("list nodes: %w", err)
		}
		for _, n := range nodes {
			c.nodeAddrs[n.Name] = translate.NodeInternalIPs(n)
		}
		svcs, err := c.services.List(labels.Everything())
		if err != nil {
			return fmt.Errorf("list services: %w", err)
		}
		// Cached keys too: a Service deleted meanwhile must leave the cache.
		keys = slices.Collect(maps.Keys(c.cache))
		for _, s := range svcs {
			keys = append(keys, s.Namespace+"/"+s.Name)
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
	}
	for _, key := range keys {
		if err := c.translate(key); err != nil {
			// Retry this key on the next run, whatever the rest does.
			c.tracker.service(key)
			return err
		}
	}
	taken, err := c.lbd.taken(ctx)
	if err != nil {
		return err
	}
	svcs, problems := translate.Merge(slices.Collect(maps.Values(c.cache)), taken)
	if time.Since(c.rejectedSince) > c.maxInterval {
		// lbd's limits may have changed: try what it refused again now and then.
		c.rejected, c.rejectedSince = map[string]refused{}, time.Now()
	}
	svcs = c.leaveOutRefused(svcs, problems)
	var resp *lbdv1.ApplyServicesResponse
	for n := 0; ; n++ {
		resp, err = c.lbd.apply(ctx, svcs)
		if err == nil {
			break
		}
		r, ok := rejected(err, svcs)
		if !ok || n == maxRejections {
			c.log.Warn("apply failed", "op", "apply", "services", len(svcs), "err", err)
			return err
		}
		svcs = c.refuse(svcs, r, problems)
	}
	c.report(problems)
	c.state.setApplied(c.objects, svcs, problems)
	c.statusChanged()
	if resp.Created+resp.Updated+resp.Deleted > 0 {
		c.log.Info("applied", "op", "apply", "services", len(svcs), "created", resp.Created, "updated", resp.Updated, "deleted", resp.Deleted)
	}
	return nil
}

// translate refreshes one Service's entry of the cache from the informers.
func (c *controller) translate(key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return fmt.Errorf("split key %q: %w", key, err)
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		delete(c.cache, key)
		delete(c.objects, key)
		return nil
	}
	if err != nil {
		return fmt.Errorf("get service %s: %w", key, err)
	}
	epSlices, err := c.slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}))
	if err != nil {
		return fmt.Errorf("list endpoint slices of %s: %w", key, err)
	}
	res := translate.Service(svc, epSlices, c.nodeAddrs, c.opts)
	if len(res.Services) == 0 && len(res.Problems) == 0 {
		delete(c.cache, key)
		delete(c.objects, key)
		return nil
	}
	c.cache[key] = translate.Item{Key: key, Created: svc.CreationTimestamp.Time, Result: res}
	c.objects[key] = svc
	return nil
}

// refused is what lbd refused once: a service (backend nil) or one of its backends, as it
// was sent, and why.
type refused struct {
	backend *lbdv1.Backend
	svc     *lbdv1.Service
	problem translate.Problem
}

// refuse leaves out what lbd refused in the last apply, remembers it, and adds the problem
// to the Service's.
func (c *controller) refuse(svcs []*lbdv1.Service, r rejection, problems map[string][]translate.Problem) []*lbdv1.Service {
	bad := svcs[r.service]
	key, _, _ := translate.ServiceKeyVIP(bad.Name)
	p := translate.Problem{Reason: "RejectedByLbd"}
	var rec refused
	if r.backend >= 0 {
		b := bad.Backends[r.backend]
		p.Message = fmt.Sprintf("lbd service %s: backend %s:%d left out: lbd says %s: %s", bad.Name, b.Address, b.Port, r.field, r.msg)
		rec = refused{backend: b, problem: p}
		fixed := proto.Clone(bad).(*lbdv1.Service)
		fixed.Backends = slices.Delete(fixed.Backends, r.backend, r.backend+1)
		svcs = slices.Clone(svcs)
		svcs[r.service] = fixed
		c.rejected[refusedKey(bad.Name, b)] = rec
	} else {
		p.Message = fmt.Sprintf("lbd service %s left out: lbd says %s: %s", bad.Name, fieldOr(r.field, "service"), r.msg)
		rec = refused{svc: bad, problem: p}
		svcs = slices.Delete(slices.Clone(svcs), r.service, r.service+1)
		c.rejected[refusedKey(bad.Name, nil)] = rec
	}
	c.log.Warn("lbd refused part of the apply", "op", "apply", "service", key, "msg", p.Message)
	problems[key] = append(problems[key], p)
	return svcs
}

// leaveOutRefused leaves out, before applying, what lbd refused before in the same form,
// so a lasting bad object costs no extra call per sync.
func (c *controller) leaveOutRefused(svcs []*lbdv1.Service, problems map[string][]translate.Problem) []*lbdv1.Service {
	if len(c.rejected) == 0 {
		return svcs
	}
	out := make([]*lbdv1.Service, 0, len(svcs))
	for _, s := range svcs {
		key, _, _ := translate.ServiceKeyVIP(s.Name)
		if r, ok := c.rejected[refusedKey(s.Name, nil)]; ok && proto.Equal(r.svc, s) {
			problems[key] = append(problems[key], r.problem)
			continue
		}
		var keep []*lbdv1.Backend
		for _, b := range s.Backends {
			if r, ok := c.rejected[refusedKey(s.Name, b)]; ok && proto.Equal(r.backend, b) {
				problems[key] = append(problems[key], r.problem)
				continue
			}
			keep = append(keep, b)
		}
		if len(keep) != len(s.Backends) {
			s = proto.Clone(s).(*lbdv1.Service)
			s.Backends = keep
		}
		out = append(out, s)
	}
	return out
}

func refusedKey(svc string, b *lbdv1.Backend) string {
	if b == nil {
		return svc
	}
	return fmt.Sprintf("%s|%s|%d", svc, b.Address, b.Port)
}

func fieldOr(field, def string) string {
	if field == "" {
		return def
	}
	return field
}

// report turns new problems into Warning Events on their Services, once per problem: a
// problem that persists is not repeated at every sync.
func (c *controller) report(problems map[string][]translate.Problem) {
	for key, ps := range problems {
		old := c.reported[key]
		for _, p := range ps {
			if slices.Contains(old, p) {
				continue
			}
			c.log.Warn("service not fully served", "op", "translate", "service", key, "reason", p.Reason, "msg", p.Message)
			if svc := c.service(key); svc != nil {
				c.recorder.Event(svc, corev1.EventTypeWarning, p.Reason, p.Message)
			}
		}
	}
	c.reported = problems
}

func (c *controller) service(key string) *corev1.Service {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.services.Services(ns).Get(name)
	if err != nil {
		return nil
	}
	return svc
}
