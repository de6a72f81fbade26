package api_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestConcurrentClients runs 16 clients doing creates, updates, deletes, backend edits of
// one shared service and ApplyServices for 20 s (2 s with -short). Each client keeps a
// model of the effect of the calls the server acknowledged; at the end the server's state
// must equal the union of the models. Run under -race.
func TestConcurrentClients(t *testing.T) {
	dur := 20 * time.Second
	if testing.Short() {
		dur = 2 * time.Second
	}
	c := startWith(t, store.DefaultLimits())
	shared := &lbdv1.Service{Name: "shared", Vip: "203.0.113.250", Port: 443, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
	if _, err := c.lb.CreateService(ctx(t), &lbdv1.CreateServiceRequest{Service: shared}); err != nil {
		t.Fatal(err)
	}
	const clients = 16
	type model struct {
		services map[string][]string // name → backend addresses
		applied  []string            // names owned through ApplyServices
		shared   map[string]bool     // this client's backends in "shared"
		ops      int
	}
	models := make([]*model, clients)
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := range clients {
		m := &model{services: map[string][]string{}, shared: map[string]bool{}}
		models[i] = m
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			fail := func(op string, err error, want codes.Code) {
				if status.Code(err) != want {
					t.Errorf("client %d %s: got %v, want %v", i, op, err, want)
				}
			}
			for time.Now().Before(deadline) {
				m.ops++
				j := rng.IntN(4)
				name := fmt.Sprintf("c%d-s%d", i, j)
				backends := make([]string, 1+rng.IntN(3))
				for k := range backends {
					backends[k] = fmt.Sprintf("198.18.%d.%d", 10+i, 1+rng.IntN(50))
				}
				slices.Sort(backends)
				backends = slices.Compact(backends)
				svc := &lbdv1.Service{Name: name, Vip: fmt.Sprintf("203.0.113.%d", 1+i*4+j), Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
				for _, a := range backends {
					svc.Backends = append(svc.Backends, &lbdv1.Backend{Address: a, Port: 80})
				}
				_, exists := m.services[name]
				switch op := rng.IntN(6); op {
				case 0:
					_, err := c.lb.CreateService(bg(), &lbdv1.CreateServiceRequest{Service: svc})
					if exists {
						fail("create", err, codes.AlreadyExists)
					} else if fail("create", err, codes.OK); err == nil {
						m.services[name] = backends
					}
				case 1:
					_, err := c.lb.UpdateService(bg(), &lbdv1.UpdateServiceRequest{Service: svc})
					if !exists {
						fail("update", err, codes.NotFound)
					} else if fail("update", err, codes.OK); err == nil {
						m.services[name] = backends
					}
				case 2:
					_, err := c.lb.DeleteService(bg(), &lbdv1.DeleteServiceRequest{Name: name})
					if !exists {
						fail("delete", err, codes.NotFound)
					} else if fail("delete", err, codes.OK); err == nil {
						delete(m.services, name)
					}
				case 3:
					addr := fmt.Sprintf("198.18.%d.%d", 100+i, 1+rng.IntN(20))
					_, err := c.lb.CreateBackend(bg(), &lbdv1.CreateBackendRequest{ServiceName: "shared", Backend: &lbdv1.Backend{Address: addr, Port: 443}})
					if m.shared[addr] {
						fail("add shared backend", err, codes.AlreadyExists)
					} else if fail("add shared backend", err, codes.OK); err == nil {
						m.shared[addr] = true
					}
				case 4:
					addr := fmt.Sprintf("198.18.%d.%d", 100+i, 1+rng.IntN(20))
					_, err := c.lb.DeleteBackend(bg(), &lbdv1.DeleteBackendRequest{ServiceName: "shared", Address: addr, Port: 443})
					if !m.shared[addr] {
						fail("remove shared backend", err, codes.NotFound)
					} else if fail("remove shared backend", err, codes.OK); err == nil {
						delete(m.shared, addr)
					}
				case 5:
					var names []string
					var svcs []*lbdv1.Service
					for k := range rng.IntN(4) {
						n := fmt.Sprintf("o%d-%d", i, k)
						names = append(names, n)
						svcs = append(svcs, &lbdv1.Service{Name: n, Vip: fmt.Sprintf("2001:db8::%x:%x", i+1, k+1), Port: 53, Protocol: lbdv1.Protocol_PROTOCOL_UDP,
							Backends: []*lbdv1.Backend{{Address: fmt.Sprintf("2001:db8:1::%x", 1+rng.IntN(5)), Port: 53}}})
					}
					_, err := c.lb.ApplyServices(bg(), &lbdv1.ApplyServicesRequest{Owner: fmt.Sprintf("owner-%d", i), Services: svcs})
					if fail("apply", err, codes.OK); err == nil {
						m.applied = names
					}
				}
			}
		}()
	}
	wg.Wait()

	want := map[string][]string{}
	wantShared := []string{}
	total := 0
	for _, m := range models {
		total += m.ops
		for name, bs := range m.services {
			want[name] = bs
		}
		for _, n := range m.applied {
			want[n] = nil // content checked by owner below
		}
		for a := range m.shared {
			wantShared = append(wantShared, a)
		}
	}
	list, err := c.lb.ListServices(ctx(t), &lbdv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, s := range list.Services {
		got[s.Name] = true
		var addrs []string
		for _, b := range s.Backends {
			addrs = append(addrs, b.Address)
		}
		slices.Sort(addrs) // the models sort as text, the server by address
		switch {
		case s.Name == "shared":
			slices.Sort(wantShared)
			if !slices.Equal(addrs, wantShared) {
				t.Errorf("shared backends:\n got %v\nwant %v", addrs, wantShared)
			}
		case s.Owner != "":
			if _, ok := want[s.Name]; !ok {
				t.Errorf("service %s of %s exists but the owner's last apply did not include it", s.Name, s.Owner)
			}
		default:
			w, ok := want[s.Name]
			if !ok {
				t.Errorf("service %s exists but no acknowledged operation left it", s.Name)
			} else if !slices.Equal(addrs, w) {
				t.Errorf("service %s backends %v, want %v", s.Name, addrs, w)
			}
		}
	}
	for name := range want {
		if !got[name] {
			t.Errorf("service %s missing", name)
		}
	}
	t.Logf("%d acknowledged operations by %d clients in %v; %d services at the end", total, clients, dur, len(list.Services))
}
