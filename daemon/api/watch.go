package api

import (
	"sync"
	"time"

	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults of Options.MaxWatchers and Options.WatchBacklog.
const (
	DefaultMaxWatchers  = 256
	DefaultWatchBacklog = 65536
)

// WatchServices implements lbdv1.LoadBalancerServiceServer: a snapshot, a SYNCED marker,
// then every change. At most MaxWatchers watches are served at once. A watcher that
// falls more than WatchBacklog changes behind is ended with RESOURCE_EXHAUSTED rather
// than slowing the store down or holding its backlog without bound.
func (s *Server) WatchServices(r *lbdv1.WatchServicesRequest, stream lbdv1.LoadBalancerService_WatchServicesServer) error {
	if !s.watchers.acquire() {
		return status.Errorf(codes.ResourceExhausted, "lbd serves at most %d watches at once (api.max_watchers) and that many are open; "+
			"close one, or raise api.max_watchers", s.opts.MaxWatchers)
	}
	defer s.watchers.release()
	q := &watchQueue{owner: r.GetOwner(), limit: s.opts.WatchBacklog, ready: make(chan struct{}, 1), over: make(chan struct{})}
	snap, _, cancel := s.st.SnapshotAndListen(q.push)
	defer cancel()
	// Sending runs apart so that a client that stopped reading, whose Send blocks on
	// flow control, is still ended when its backlog passes the limit: returning closes
	// the stream, which ends the blocked Send.
	done := make(chan struct{})
	defer close(done)
	sent := make(chan error, 1)
	stale := &watchStaleness{reason: s.st.Stale, events: r.GetStalenessEvents()}
	go func() { sent <- sendWatch(stream, q, snap, stale, done) }()
	select {
	case err := <-sent:
		return err
	case <-q.over:
		return status.Errorf(codes.ResourceExhausted, "this watch fell more than %d changes behind (api.watch_backlog) and was ended; "+
			"watch again for a fresh snapshot", s.opts.WatchBacklog)
	case <-s.stopping:
		return status.Error(codes.Unavailable, "lbd is shutting down; watch again when it is back")
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
}

// sendWatch sends the snapshot, SYNCED, then the queued changes (and the changes of the
// node's staleness, when asked for) until done. Every event says whether the node is
// stale as it is sent.
func sendWatch(stream lbdv1.LoadBalancerService_WatchServicesServer, q *watchQueue, snap []*model.Service, stale *watchStaleness, done <-chan struct{}) error {
	for _, svc := range snap {
		if q.owner != "" && svc.Spec.Owner != q.owner {
			continue
		}
		if err := stream.Send(stale.stamp(&lbdv1.WatchServicesResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED, Service: svc.Spec})); err != nil {
			return err
		}
	}
	if err := stream.Send(stale.stamp(&lbdv1.WatchServicesResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED})); err != nil {
		return err
	}
	tick := time.NewTicker(staleCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-tick.C:
			if ev := stale.changed(); ev != nil {
				if err := stream.Send(ev); err != nil {
					return err
				}
			}
			continue
		case <-q.ready:
		}
		for _, ev := range q.take() {
			typ := lbdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED
			switch ev.Type {
			case store.Added:
				typ = lbdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED
			case store.Deleted:
				typ = lbdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED
			}
			if err := stream.Send(stale.stamp(&lbdv1.WatchServicesResponse{Type: typ, Service: ev.Service.Spec})); err != nil {
				return err
			}
		}
	}
}

// watchQueue holds the changes a watcher has not been sent yet. The store pushes into it
// without ever blocking; past limit changes, the watcher is too slow and is ended.
type watchQueue struct {
	owner string
	limit int
	ready chan struct{} // holds a token while changes wait
	over  chan struct{} // closed once the limit was passed

	mu     sync.Mutex
	events []store.Event
	ended  bool
}

// push is the store listener.
func (q *watchQueue) push(evs []store.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return
	}
	n := len(q.events)
	for _, ev := range evs {
		if ev.Type == store.Node || (q.owner != "" && ev.Service.Spec.GetOwner() != q.owner) {
			continue
		}
		q.events = append(q.events, ev)
	}
	switch {
	case len(q.events) > q.limit:
		q.ended, q.events = true, nil
		close(q.over)
	case len(q.events) > n:
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
}

// take returns the waiting changes, in order, and empties the queue.
func (q *watchQueue) take() []store.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	evs := q.events
	q.events = nil
	return evs
}

// counter bounds concurrent users of something.
type counter struct {
	mu       sync.Mutex
	n, limit int
}

func (c *counter) acquire() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n >= c.limit {
		return false
	}
	c.n++
	return true
}

func (c *counter) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n--
}
