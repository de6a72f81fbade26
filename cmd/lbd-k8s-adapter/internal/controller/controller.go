// Package controller keeps an lbd equal to a Kubernetes cluster's view: informers on
// Services, EndpointSlices and Nodes feed a change tracker, and a bounded-frequency runner
// translates what changed and applies the owner's whole set with ApplyServices. A leader,
// elected with a Lease, allocates VIPs from pools and writes them to Service status.
package controller

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Options are what Run needs besides the configuration.
type Options struct {
	Config *config.Config
	Kube   kubernetes.Interface
	// Lbd is the connection to lbd's API (see DialLbd).
	Lbd grpc.ClientConnInterface
	// Identity names this replica in the Lease and in Events (the pod or node name).
	Identity string
	Log      *slog.Logger
}

// controller is one running adapter.
type controller struct {
	opts     translate.Options
	kube     kubernetes.Interface
	lbd      *lbdSink
	log      *slog.Logger
	recorder record.EventRecorder

	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	nodes    corelisters.NodeLister

	tracker *tracker
	sync    *Runner

	// Owned by the sync runner's goroutine.
	cache     map[string]translate.Item
	nodeAddrs translate.NodeAddresses
	reported  map[string][]translate.Problem
}

// Run runs the adapter until ctx is done. It returns an error only if it cannot start;
// lbd or the API server being unreachable later only delays convergence.
func Run(ctx context.Context, o Options) error {
	cfg := o.Config
	pools, err := cfg.IPPools()
	if err != nil {
		return fmt.Errorf("parse pools: %w", err)
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: o.Kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	c := &controller{
		opts:     cfg.TranslateOptions(),
		kube:     o.Kube,
		lbd:      &lbdSink{client: lbdv1.NewLoadBalancerServiceClient(o.Lbd), owner: cfg.Owner, log: o.Log},
		log:      o.Log,
		recorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lbd-k8s-adapter", Host: o.Identity}),
		tracker:  newTracker(),
		cache:    map[string]translate.Item{},
		reported: map[string][]translate.Problem{},
	}
	c.sync = NewRunner(c.syncOnce, cfg.Sync.MinInterval.Duration, cfg.Sync.MaxInterval.Duration)

	factory := informers.NewSharedInformerFactory(o.Kube, 0)
	svcInf := factory.Core().V1().Services()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	nodeInf := factory.Core().V1().Nodes()
	c.services, c.slices, c.nodes = svcInf.Lister(), sliceInf.Lister(), nodeInf.Lister()

	var alloc *allocator
	if len(pools) > 0 {
		alloc = newAllocator(c, pools, cfg, o.Identity)
	}
	onService := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.tracker.service(key)
			c.sync.Trigger()
			if alloc != nil {
				alloc.runner.Trigger()
			}
		}
	}
	onSlice := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok || s.Labels[discoveryv1.LabelServiceName] == "" {
			return
		}
		c.tracker.service(s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName])
		c.sync.Trigger()
	}
	onNode := func() {
		c.tracker.everything()
		c.sync.Trigger()
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{svcInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: onService, UpdateFunc: func(_, n any) { onService(n) }, DeleteFunc: onService}},
		// A slice moved to another Service (its label changed) affects both.
		{sliceInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: onSlice, UpdateFunc: func(o, n any) { onSlice(o); onSlice(n) }, DeleteFunc: onSlice}},
		{nodeInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { onNode() },
			DeleteFunc: func(any) { onNode() },
			// Nodes update their status every few seconds; only an address change matters.
			UpdateFunc: func(o, n any) {
				on, ok1 := o.(*corev1.Node)
				nn, ok2 := n.(*corev1.Node)
				if ok1 && ok2 && !slices.Equal(translate.NodeInternalIPs(on), translate.NodeInternalIPs(nn)) {
					onNode()
				}
			},
		}},
	}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(h.h); err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sync informer cache of %v", typ)
		}
	}
	c.log.Info("informers synced", "op", "start", "owner", cfg.Owner, "pools", len(pools))
	c.tracker.everything()

	var wg sync.WaitGroup
	wg.Go(func() { c.sync.Run(ctx) })
	wg.Go(func() { c.lbd.watch(ctx, c.sync.Trigger) })
	if alloc != nil {
		wg.Go(func() { alloc.run(ctx) })
	}
	wg.Wait()
	return nil
}

// syncOnce re-translates the Services that changed and applies the owner's whole set.
func (c *controller) syncOnce(ctx context.Context) error {
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
	c.report(problems)
	resp, err := c.lbd.apply(ctx, svcs)
	if err != nil {
		c.log.Warn("apply failed", "op", "apply", "services", len(svcs), "err", err)
		return err
	}
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
		return nil
	}
	c.cache[key] = translate.Item{Key: key, Created: svc.CreationTimestamp.Time, Result: res}
	return nil
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
