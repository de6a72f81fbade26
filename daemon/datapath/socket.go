//go:build linux

package datapath

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/bpf/socklb"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// socketLinkPrefix names the pinned links of the socket-level hooks.
const socketLinkPrefix = "cgroup-"

// openSocket attaches the socket-level programs to the configured cgroup, on the LB
// maps; without SocketLB it removes hooks a previous configuration left attached.
func (m *Manager) openSocket() error {
	if !m.cfg.SocketLB {
		return dropSocketLinks(m.cfg.linksDir(), 0, m.log)
	}
	cg := m.cfg.SocketCgroup
	if cg == "" {
		var err error
		if cg, err = CgroupRoot(); err != nil {
			return err
		}
	}
	id, err := socklb.CgroupID(cg)
	if err != nil {
		return err
	}
	// Hooks pinned for another cgroup (the configuration changed) are detached first:
	// a process must never be translated by a cgroup lbd no longer serves.
	if err := dropSocketLinks(m.cfg.linksDir(), id, m.log); err != nil {
		return err
	}
	opts := socklb.Options{LB: m.lb, PinPath: m.cfg.socketDir(), RevNATSize: m.cfg.SocketRevNATSize}
	spec, err := socklb.Spec(opts)
	if err != nil {
		return err
	}
	err = m.loadWithMigration(m.cfg.socketDir(), spec, func() error {
		var err error
		if m.sock, err = socklb.Load(opts); err != nil {
			return fmt.Errorf("load socket-level programs: %+v", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, h := range m.sock.Hooks() {
		err := m.attach(socketLinkPrefix+h.Name, h.Program, func() (link.Link, error) { return socklb.AttachHook(h, cg) })
		if err != nil {
			return err
		}
	}
	m.log.Info("socket-level load balancing attached", "op", "attach", "cgroup", cg)
	return nil
}

// DetachSocketLB removes the socket-level hooks pinned under a bpffs directory, for a
// node that runs without a datapath (no role) and so never opens a Manager, which
// would otherwise do it: with socket_lb off, no process may stay translated by hooks
// a previous configuration attached.
func DetachSocketLB(bpffsDir string, log hclog.Logger) error {
	return dropSocketLinks(filepath.Join(bpffsDir, "links"), 0, log)
}

// dropSocketLinks unpins the socket-level links under dir that are not attached to the
// cgroup with ID keep (0: all of them), which detaches them.
func dropSocketLinks(dir string, keep uint64, log hclog.Logger) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pinned links: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), socketLinkPrefix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return fmt.Errorf("open pinned link %s: %w", e.Name(), err)
		}
		info, err := l.Info()
		if err != nil {
			l.Close()
			return fmt.Errorf("read pinned link %s: %w", e.Name(), err)
		}
		if cg := info.Cgroup(); keep != 0 && cg != nil && cg.CgroupId == keep {
			l.Close()
			continue
		}
		// Detached explicitly: releasing the last reference (pin and handle) would detach
		// it too, but later, in the kernel's own time, while hooks keep translating.
		err = l.Detach()
		l.Close()
		if err != nil {
			return fmt.Errorf("detach %s: %w", e.Name(), err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("unpin %s: %w", e.Name(), err)
		}
		log.Info("detached socket-level hook", "op", "detach", "link", e.Name())
	}
	return nil
}

// CgroupRoot returns where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on a
// unified system, /sys/fs/cgroup/unified in hybrid mode).
func CgroupRoot() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find the cgroup v2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source ...
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] == "cgroup2" && fields[3] == "/" {
			return fields[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("find the cgroup v2 mount: %w", err)
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted: socket-level load balancing needs one (mount -t cgroup2 none /sys/fs/cgroup)")
}

// socketCounters adds the socket-level counters to a stats response.
func (m *Manager) socketCounters(resp *lbdv1.GetStatsResponse) error {
	if m.sock == nil {
		return nil
	}
	s, err := m.sock.Stats()
	if err != nil {
		return err
	}
	for _, c := range s.List() {
		resp.SocketEvents = append(resp.SocketEvents, &lbdv1.EventCounter{Name: c.Stat.String(), Count: c.Count})
	}
	return nil
}

// ListSocketTranslations lists the translated sockets of local processes.
func (m *Manager) ListSocketTranslations(_ context.Context, r *lbdv1.ListSocketTranslationsRequest) (*lbdv1.ListSocketTranslationsResponse, error) {
	if m.sock == nil {
		return nil, status.Error(codes.FailedPrecondition, "socket-level load balancing is not enabled on this node (datapath.socket_lb)")
	}
	limit := int(r.Limit)
	if limit == 0 {
		limit = 1000
	}
	ts, err := m.sock.Translations()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list socket translations: %v", err)
	}
	m.mu.Lock()
	names := map[uint32]string{}
	for id, p := range m.programmed {
		names[id] = p.name
	}
	m.mu.Unlock()
	slices.SortFunc(ts, func(a, b socklb.Translation) int {
		return cmp.Or(cmp.Compare(a.Created, b.Created), cmp.Compare(a.Cookie, b.Cookie))
	})
	now, wall := lbxdp.MonotonicNow(), time.Now()
	match := func(s string, a netip.Addr) bool { return s == "" || s == a.String() }
	resp := &lbdv1.ListSocketTranslationsResponse{}
	for _, t := range ts {
		if !match(r.Vip, t.Service.Addr()) || !match(r.BackendAddress, t.Backend.Addr()) {
			continue
		}
		if len(resp.Translations) == limit {
			resp.Truncated = true
			break
		}
		resp.Translations = append(resp.Translations, &lbdv1.SocketTranslation{
			SocketCookie: t.Cookie, Protocol: protoEnum(t.Proto), ServiceName: names[t.ServiceID],
			Vip: t.Service.Addr().String(), VipPort: uint32(t.Service.Port()),
			BackendAddress: t.Backend.Addr().String(), BackendPort: uint32(t.Backend.Port()),
			CreateTime: timestamppb.New(wall.Add(t.Created - now)),
		})
	}
	return resp, nil
}
