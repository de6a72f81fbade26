// Package controller keeps an lbd equal to a Kubernetes cluster's view: informers on
// Services, EndpointSlices and Nodes feed a change tracker, and a bounded-frequency runner
// translates what changed and applies the owner's whole set with ApplyServices. A leader,
// elected with a Lease, allocates VIPs from pools and writes Service status (ingress IPs
// and conditions); every replica records Events about what its lbd serves.
package controller

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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
	// Kube reads the cluster and writes Service status and the Lease.
	Kube kubernetes.Interface
	// Events records Events; nil uses Kube. A client of its own keeps a burst of Events
	// from using the rate budget of status writes.
	Events kubernetes.Interface
	// Lbd is the connection to lbd's API (see DialLbd).
	Lbd grpc.ClientConnInterface
	// Identity names this replica in the Lease and in Events (the node name).
	Identity string
	Log      *slog.Logger
	// Health, if set, is told the adapter's state for its probes (see Health).
	Health *Health
}

// controller is one running adapter.
type controller struct {
	opts        translate.Options
	kube        kubernetes.Interface
	lbd         *lbdSink
	log         *slog.Logger
	recorder    record.EventRecorder
	identity    string
	maxInterval time.Duration
	health      *Health

	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	nodes    corelisters.NodeLister

	tracker *tracker
	sync    *Runner
	state   *state
	status  *statusWriter
	events  *programmedEvents

	// Owned by the sync runner's goroutine.
	cache         map[string]translate.Item
	objects       map[string]*corev1.Service
	nodeAddrs     translate.NodeAddresses
	reported      map[string][]translate.Problem
	rejected      map[string]refused
	rejectedSince time.Time
}

// Run runs the adapter until ctx is done. It returns an error only if it cannot start;
// lbd or the API server being unreachable later only delays convergence.
func Run(ctx context.Context, o Options) error {
	cfg := o.Config
	pools, err := cfg.IPPools()
	if err != nil {
		return fmt.Errorf("parse pools: %w", err)
	}
	events := o.Events
	if events == nil {
		events = o.Kube
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: events.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	health := o.Health
	if health == nil {
		health = NewHealth()
	}
	c := &controller{
		opts:          cfg.TranslateOptions(),
		kube:          o.Kube,
		lbd:           &lbdSink{client: lbdv1.NewLoadBalancerServiceClient(o.Lbd), owner: cfg.Owner, log: o.Log},
		log:           o.Log,
		recorder:      broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lbd-k8s-adapter", Host: o.Identity}),
		identity:      o.Identity,
		maxInterval:   cfg.Sync.MaxInterval.Duration,
		health:        health,
		tracker:       newTracker(),
		state:         newState(),
		cache:         map[string]translate.Item{},
		objects:       map[string]*corev1.Service{},
		reported:      map[string][]translate.Problem{},
		rejected:      map[string]refused{},
		rejectedSince: time.Now(),
	}
	c.sync = NewRunner(c.syncOnce, cfg.Sync.MinInterval.Duration, cfg.Sync.MaxInterval.Duration)
	c.status = newStatusWriter(c, pools, cfg)
	c.events = newProgrammedEvents(c, cfg)

	factory := informers.NewSharedInformerFactory(o.Kube, 0)
	svcInf := factory.Core().V1().Services()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	nodeInf := factory.Core().V1().Nodes()
	c.services, c.slices, c.nodes = svcInf.Lister(), sliceInf.Lister(), nodeInf.Lister()
	if err := c.addHandlers(svcInf.Informer(), sliceInf.Informer(), nodeInf.Informer()); err != nil {
		return err
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
	health.setInformersSynced()
	c.tracker.everything()

	var wg sync.WaitGroup
	wg.Go(func() { c.sync.Run(ctx) })
	wg.Go(func() { c.lbd.watch(ctx, c.state, c.sync.Trigger, c.statusChanged) })
	wg.Go(func() { c.status.run(ctx) })
	wg.Go(func() { c.events.runner.Run(ctx) })
	wg.Wait()
	return nil
}

// addHandlers feeds the informers' changes to the tracker and the runners.
func (c *controller) addHandlers(svcInf, sliceInf, nodeInf cache.SharedIndexInformer) error {
	onService := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.tracker.service(key)
			c.sync.Trigger()
			c.status.runner.Trigger()
		}
	}
	onServiceUpdate := func(o, n any) {
		old, ok1 := o.(*corev1.Service)
		svc, ok2 := n.(*corev1.Service)
		if ok1 && ok2 && !translate.InputsDiffer(old, svc) {
			// Only status the translation does not read changed, most often the
			// conditions this adapter wrote: no sync, but the status writer looks again
			// (someone else may have written).
			c.status.runner.Trigger()
			return
		}
		onService(n)
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
		{svcInf, cache.ResourceEventHandlerFuncs{AddFunc: onService, UpdateFunc: onServiceUpdate, DeleteFunc: onService}},
		// A slice moved to another Service (its label changed) affects both.
		{sliceInf, cache.ResourceEventHandlerFuncs{AddFunc: onSlice, UpdateFunc: func(o, n any) { onSlice(o); onSlice(n) }, DeleteFunc: onSlice}},
		{nodeInf, cache.ResourceEventHandlerFuncs{
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
	return nil
}

// statusChanged is called when what lbd holds or says may have changed: the Service
// conditions and the Events about programming follow.
func (c *controller) statusChanged() {
	c.status.runner.Trigger()
	c.events.runner.Trigger()
}
