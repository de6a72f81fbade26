package lbd_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
)

// TestUnixSocketAPI checks what a local client finds on the socket: mode 0600, the health
// service reporting SERVING, and reflection listing the API (grpcurl relies on it).
func TestUnixSocketAPI(t *testing.T) {
	in := newInstance(t)
	_, conn := startLBD(t, in)

	fi, err := os.Lstat(in.socket)
	if err != nil {
		t.Fatalf("stat socket: %v", err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a socket with permissions 0600", fi.Mode())
	}

	ctx := ctxT(t)
	res, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || res.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check: %v, %v; want SERVING", res, err)
	}

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("open reflection stream: %v", err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatalf("send reflection request: %v", err)
	}
	ref, err := stream.Recv()
	if err != nil {
		t.Fatalf("receive reflection response: %v", err)
	}
	var names []string
	for _, s := range ref.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"lbd.v1.LoadBalancerService", "lbd.v1.BgpService", "lbd.v1.NodeService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
	stream.CloseSend()
}

// TestGracefulStop checks that SIGTERM and SIGINT stop lbd with exit code 0, remove its
// socket, and release the state lock so the next lbd starts on the same state.
func TestGracefulStop(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			in := newInstance(t)
			p, conn := startLBD(t, in)
			svc := restartService(1)
			if _, err := lbdv1.NewLoadBalancerServiceClient(conn).CreateService(ctxT(t), &lbdv1.CreateServiceRequest{Service: svc}); err != nil {
				t.Fatalf("create service: %v", err)
			}
			p.signal(t, sig)
			if code := p.wait(t, 5*time.Second); code != 0 {
				t.Fatalf("exit code %d after %v, want 0", code, sig)
			}
			if _, err := os.Lstat(in.socket); !os.IsNotExist(err) {
				t.Errorf("socket %s still there after %v (stat: %v)", in.socket, sig, err)
			}
			assertContains(t, p.stderr.String(), "shutting down")

			_, conn = startLBD(t, in)
			if _, err := lbdv1.NewLoadBalancerServiceClient(conn).GetService(ctxT(t), &lbdv1.GetServiceRequest{Name: svc.Name}); err != nil {
				t.Errorf("get service after the restart: %v", err)
			}
		})
	}
}

// TestGracefulStopWithOpenWatch checks that an open WatchServices stream, which never
// ends by itself, does not hold up a SIGTERM: a client such as the Kubernetes adapter
// keeps one open all the time.
func TestGracefulStopWithOpenWatch(t *testing.T) {
	in := newInstance(t)
	p, conn := startLBD(t, in)
	stream, err := lbdv1.NewLoadBalancerServiceClient(conn).WatchServices(ctxT(t), &lbdv1.WatchServicesRequest{})
	if err != nil {
		t.Fatalf("watch services: %v", err)
	}
	if ev, err := stream.Recv(); err != nil || ev.Type != lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
		t.Fatalf("first watch event: %v, %v; want SYNCED", ev, err)
	}
	start := time.Now()
	p.signal(t, syscall.SIGTERM)
	code := p.wait(t, 15*time.Second)
	took := time.Since(start)
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if took > 3*time.Second {
		t.Errorf("lbd took %v to stop with a watch open, want under 3s: the watch should end at shutdown", took.Round(100*time.Millisecond))
	}
	if _, err := stream.Recv(); err == nil {
		t.Errorf("watch stream still delivers after the daemon stopped")
	}
}

// TestGracefulStopWithUnreadWatch checks that a watch client that stopped reading (a
// suspended `lbctl service list -w`, a stuck controller) does not hold a SIGTERM for
// the whole shutdown grace: lbd ends the watch at once, but its status stays queued
// behind the changes the client never read, and gRPC's graceful stop waits for it.
// lbd waits a moment for such replies and then stops.
func TestGracefulStopWithUnreadWatch(t *testing.T) {
	in := newInstance(t)
	p, conn := startLBD(t, in)
	stall := make(chan struct{})
	watcher, err := grpc.NewClient("unix://"+in.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix://"))
			if err != nil {
				return nil, err
			}
			return &stallingConn{Conn: c, stall: stall, closed: make(chan struct{})}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	watch, err := lbdv1.NewLoadBalancerServiceClient(watcher).WatchServices(ctxT(t), &lbdv1.WatchServicesRequest{})
	if err != nil {
		t.Fatalf("watch services: %v", err)
	}
	if ev, err := watch.Recv(); err != nil || ev.Type != lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
		t.Fatalf("first watch event: %v, %v; want SYNCED", ev, err)
	}
	// From here the watcher's process reads nothing from its socket, as if suspended.
	// The changes of 2,000 services (about 600 KB) are far more than gRPC lets lbd send
	// unread (a 64 KiB window, which grows only as the client reads).
	close(stall)
	svcs := make([]*lbdv1.Service, 2000)
	for i := range svcs {
		svcs[i] = restartService(i)
	}
	if _, err := lbdv1.NewLoadBalancerServiceClient(conn).ApplyServices(ctxT(t), &lbdv1.ApplyServicesRequest{Owner: "t", Services: svcs}); err != nil {
		t.Fatalf("apply %d services: %v", len(svcs), err)
	}
	start := time.Now()
	p.signal(t, syscall.SIGTERM)
	code := p.wait(t, 30*time.Second)
	took := time.Since(start)
	t.Logf("lbd exited %v after SIGTERM", took.Round(10*time.Millisecond))
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	assertContains(t, p.stderr.String(), "API stopped with replies its clients did not read")
	if took >= 10*time.Second {
		t.Errorf("lbd took %v to stop: the whole shutdown grace (10 s), waiting for a client that does not read", took.Round(100*time.Millisecond))
	}
}

// stallingConn is a client's connection whose reads block, once stall is closed, until
// the connection is closed: a client process that stopped reading.
type stallingConn struct {
	net.Conn
	stall  <-chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (c *stallingConn) Read(b []byte) (int, error) {
	select {
	case <-c.stall:
		<-c.closed
		return 0, net.ErrClosed
	default:
		return c.Conn.Read(b)
	}
}

func (c *stallingConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestStateLock checks that a second lbd on the same state directory refuses to start,
// and that its attempt disturbs neither the running daemon nor the state file.
func TestStateLock(t *testing.T) {
	in := newInstance(t)
	_, conn := startLBD(t, in)
	lb := lbdv1.NewLoadBalancerServiceClient(conn)
	if _, err := lb.CreateService(ctxT(t), &lbdv1.CreateServiceRequest{Service: restartService(3)}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	// A running lbd keeps its latest changes in the journal next to the state file.
	sum := func() [32]byte {
		h := sha256.New()
		for _, p := range []string{in.statePath(), in.statePath() + ".journal"} {
			data, err := os.ReadFile(p)
			if err != nil && !os.IsNotExist(err) {
				t.Fatalf("read state: %v", err)
			}
			h.Write(data)
			h.Write([]byte{0})
		}
		return [32]byte(h.Sum(nil))
	}
	before := sum()

	second := newInstance(t)
	second.stateDir = in.stateDir
	code, out := runExit(t, 5*time.Second, second.args()...)
	if code == 0 {
		t.Fatalf("a second lbd on the same state directory exited 0; output:\n%s", out)
	}
	assertContains(t, out, "state file "+in.statePath()+" is in use by another lbd (PID ")
	if _, err := os.Stat(second.socket); err == nil {
		t.Errorf("the refused lbd created its socket %s", second.socket)
	}

	if sum() != before {
		t.Errorf("state file or journal changed by the refused lbd")
	}
	fresh := lbdv1.NewLoadBalancerServiceClient(dialUnix(t, in.socket))
	if _, err := fresh.GetService(ctxT(t), &lbdv1.GetServiceRequest{Name: restartService(3).Name}); err != nil {
		t.Errorf("first lbd no longer serves on a new connection: %v", err)
	}
}

// TestSocketInUse checks that an lbd with its own state but the socket of a running lbd
// refuses to start and leaves that socket alone.
func TestSocketInUse(t *testing.T) {
	in := newInstance(t)
	startLBD(t, in)

	second := newInstance(t)
	second.socket = in.socket
	code, out := runExit(t, 5*time.Second, second.args()...)
	if code == 0 {
		t.Fatalf("a second lbd on the same socket exited 0; output:\n%s", out)
	}
	assertContains(t, out, in.socket, "another lbd is listening")
	if _, err := os.Lstat(in.socket); err != nil {
		t.Fatalf("the refused lbd removed the running lbd's socket: %v", err)
	}
	if _, err := lbdv1.NewNodeServiceClient(dialUnix(t, in.socket)).GetNode(ctxT(t), &lbdv1.GetNodeRequest{}); err != nil {
		t.Errorf("first lbd no longer serves on a new connection: %v", err)
	}
}

// TestVersion checks that --version prints the version on stdout, where scripts capture
// it, and exits 0.
func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(lbdBin, "--version")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("lbd --version: %v; stderr:\n%s", err, stderr.String())
	}
	if !strings.HasPrefix(stdout.String(), "lbd ") {
		t.Errorf("lbd --version printed %q on stdout and %q on stderr, want \"lbd <version>\" on stdout", stdout.String(), stderr.String())
	}
}
