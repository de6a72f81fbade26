package api_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/authz"
	"github.com/lbd-dev/lbd/daemon/peercred"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// The owner rule of a writer is decided where the store makes the change: a change of a
// service's owner between the authorization's look at the stored owner and the write
// cannot let a writer touch another owner's service. These tests serve the API behind
// the guard as lbd does, to a writer (uid 1000 on the socket) limited to team-a.

// guarded is the API served behind the authorization guard of a policy, with a hook
// that runs right after the guard has looked up a service's owner.
type guarded struct {
	st *store.Store
	lb lbdv1.LoadBalancerServiceClient
	// afterLookup, if set, runs after the guard's next owner lookup, once.
	afterLookup atomic.Pointer[func()]
}

// asUID1000 are server credentials that take every client for uid 1000 on the socket
// (peercred, which reads the kernel's word, would see the test's own uid: root, admin).
type asUID1000 struct{ peercred.Credentials }

func (asUID1000) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peercred.AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		Creds: peercred.Creds{UID: 1000, GIDs: []uint32{1000}}}, nil
}

func (c asUID1000) Clone() credentials.TransportCredentials { return c }

func startGuarded(t *testing.T) *guarded {
	dir := shortDir(t)
	st, err := store.Open(store.Options{Path: filepath.Join(dir, "state.pb"), Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - role: writer\n    owners: [team-a]\n    unix_users: [\"1000\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := authz.Load(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	g := &guarded{st: st}
	lookup := func(name string) (string, bool) {
		svc, err := st.GetService(name)
		if f := g.afterLookup.Swap(nil); f != nil {
			(*f)()
		}
		if err != nil {
			return "", false
		}
		return svc.GetOwner(), true
	}
	guard := authz.NewGuard(p, lookup, api.WithOwnerCheck)
	srv := grpc.NewServer(grpc.Creds(asUID1000{}), grpc.ChainUnaryInterceptor(guard.UnaryInterceptor))
	api.New(api.Options{Store: st}).Register(srv)
	ln, err := net.Listen("unix", filepath.Join(dir, "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(peercred.NewListener(ln.(*net.UnixListener)))
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	g.lb = lbdv1.NewLoadBalancerServiceClient(conn)
	return g
}

// shortDir is a directory for the test whose socket path fits in 108 bytes.
func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "api-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func webOf(owner string, backends ...string) *lbdv1.Service {
	svc := &lbdv1.Service{Name: "web", Owner: owner, Vip: "203.0.113.10", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
	for _, b := range backends {
		svc.Backends = append(svc.Backends, &lbdv1.Backend{Address: b, Port: 8080})
	}
	return svc
}

// handOver replaces web (team-a's) with a web of team-b, as an admin would, and
// returns it as stored.
func (g *guarded) handOver(t *testing.T) *lbdv1.Service {
	if err := g.st.DeleteService("web"); err != nil {
		t.Errorf("delete team-a's web: %v", err)
	}
	if _, err := g.st.CreateService(webOf("team-b", "198.18.2.1")); err != nil {
		t.Errorf("create team-b's web: %v", err)
	}
	return specOf(t, g.st)
}

// writerCalls are the writer's calls that touch web, by name.
func writerCalls(lb lbdv1.LoadBalancerServiceClient) map[string]func(context.Context) error {
	ignore := func(_ any, err error) error { return err }
	return map[string]func(context.Context) error{
		"UpdateService": func(ctx context.Context) error {
			return ignore(lb.UpdateService(ctx, &lbdv1.UpdateServiceRequest{Service: webOf("team-a", "198.18.1.9")}))
		},
		"DeleteService": func(ctx context.Context) error {
			return ignore(lb.DeleteService(ctx, &lbdv1.DeleteServiceRequest{Name: "web"}))
		},
		"CreateBackend": func(ctx context.Context) error {
			return ignore(lb.CreateBackend(ctx, &lbdv1.CreateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.9", Port: 8080}}))
		},
		"UpdateBackend": func(ctx context.Context) error {
			return ignore(lb.UpdateBackend(ctx, &lbdv1.UpdateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.2.1", Port: 8080, Weight: 7},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"weight"}}}))
		},
		"DeleteBackend": func(ctx context.Context) error {
			return ignore(lb.DeleteBackend(ctx, &lbdv1.DeleteBackendRequest{ServiceName: "web", Address: "198.18.2.1", Port: 8080}))
		},
		"ApplyServices": func(ctx context.Context) error {
			return ignore(lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: "team-a", Services: []*lbdv1.Service{webOf("", "198.18.1.9")}}))
		},
	}
}

// TestOwnerChangedBetweenCheckAndWrite: web belongs to team-a when the guard looks, and
// to team-b (given by an admin) when the writer's change reaches the store. Each of the
// writer's calls is refused and team-b's web is left as it was.
func TestOwnerChangedBetweenCheckAndWrite(t *testing.T) {
	for name := range writerCalls(nil) {
		t.Run(name, func(t *testing.T) {
			g := startGuarded(t)
			if _, err := g.st.CreateService(webOf("team-a", "198.18.2.1")); err != nil {
				t.Fatal(err)
			}
			var handed *lbdv1.Service
			handOver := func() { handed = g.handOver(t) }
			g.afterLookup.Store(&handOver)
			err := writerCalls(g.lb)[name](ctx(t))
			if g.afterLookup.Load() != nil {
				t.Fatal("the guard looked up no owner: this test no longer puts the change between the check and the write")
			}
			// A request that names team-a as web's owner is refused by the store's own
			// rule that an owner does not change; the others only by the owner check.
			want := codes.PermissionDenied
			if name == "UpdateService" || name == "ApplyServices" {
				want = codes.FailedPrecondition
			}
			if status.Code(err) != want {
				t.Errorf("the writer's call on team-b's web: %v, want %v", err, want)
			}
			if after := specOf(t, g.st); !proto.Equal(after, handed) {
				t.Errorf("team-b's web after the writer's call: %v, want it as handed over: %v", after, handed)
			}
		})
	}
}

// TestOwnerChangesRaceWrites: an admin hands web from team-a to team-b and back while
// the writer adds and removes a backend of web, for a second. The writer's backend is
// never in team-b's web.
func TestOwnerChangesRaceWrites(t *testing.T) {
	g := startGuarded(t)
	if _, err := g.st.CreateService(webOf("team-a")); err != nil {
		t.Fatal(err)
	}
	var violations atomic.Int64
	_, _, cancel := g.st.SnapshotAndListen(func(evs []store.Event) {
		for _, ev := range evs {
			if ev.Service.Spec.GetOwner() == "team-b" && len(ev.Service.Spec.GetBackends()) > 0 {
				violations.Add(1)
			}
		}
	})
	defer cancel()
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	var writes, refused atomic.Int64
	wg.Go(func() {
		for owner := "team-b"; time.Now().Before(stop); {
			if err := g.st.DeleteService("web"); err != nil && status.Code(err) != codes.NotFound {
				t.Errorf("admin delete: %v", err)
			}
			if _, err := g.st.CreateService(webOf(owner)); err != nil {
				t.Errorf("admin create: %v", err)
			}
			owner = map[string]string{"team-a": "team-b", "team-b": "team-a"}[owner]
		}
	})
	add := func(ctx context.Context) error {
		_, err := g.lb.CreateBackend(ctx, &lbdv1.CreateBackendRequest{ServiceName: "web", Backend: &lbdv1.Backend{Address: "198.18.1.9", Port: 8080}})
		return err
	}
	del := func(ctx context.Context) error {
		_, err := g.lb.DeleteBackend(ctx, &lbdv1.DeleteBackendRequest{ServiceName: "web", Address: "198.18.1.9", Port: 8080})
		return err
	}
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				for _, call := range []func(context.Context) error{add, del} {
					err := call(ctx(t))
					switch status.Code(err) {
					case codes.OK:
						writes.Add(1)
					case codes.PermissionDenied:
						refused.Add(1)
					case codes.NotFound, codes.AlreadyExists:
					default:
						t.Errorf("writer: %v", err)
					}
				}
			}
		})
	}
	wg.Wait()
	if writes.Load() == 0 || refused.Load() == 0 {
		t.Errorf("the writer made %d changes and was refused %d times: the race was not run", writes.Load(), refused.Load())
	}
	if n := violations.Load(); n > 0 {
		t.Errorf("team-b's web held the writer's backend %d times", n)
	}
	t.Logf("writer: %d changes, %d refused", writes.Load(), refused.Load())
}

// specOf is web as stored, spec only.
func specOf(t *testing.T, st *store.Store) *lbdv1.Service {
	svc, err := st.GetService("web")
	if err != nil {
		t.Fatalf("get web: %v", err)
	}
	return store.SpecOnly(svc)
}
