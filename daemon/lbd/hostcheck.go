package lbd

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/lbd-dev/lbd/daemon/config"
)

// checkHost checks what --check-config can only check on the host lbd will run on: the
// interfaces the configuration names exist, and the addresses it binds or sends from are
// assigned to one of them. It reports every problem, each naming its field.
func checkHost(cfg config.Config) error {
	ifaces, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("list the host's interfaces: %w", err)
	}
	names := map[string]bool{}
	local := map[netip.Addr]bool{}
	for _, ifc := range ifaces {
		names[ifc.Name] = true
		addrs, err := ifc.Addrs()
		if err != nil {
			return fmt.Errorf("list the addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				local[p.Addr().Unmap()] = true
			}
		}
	}
	var errs []error
	for i, name := range cfg.Datapath.Interfaces {
		if !names[name] {
			errs = append(errs, fmt.Errorf("datapath.interfaces[%d]: interface %q does not exist on this host", i, name))
		}
	}
	assigned := func(field, s string) {
		addr, err := netip.ParseAddr(s)
		if err != nil || addr.IsUnspecified() || local[addr.Unmap()] {
			return // the configuration's own validation speaks of unparsable addresses
		}
		errs = append(errs, fmt.Errorf("%s: %s is not assigned to any interface of this host", field, addr))
	}
	assigned("datapath.underlay_v4", cfg.Datapath.UnderlayV4)
	assigned("datapath.underlay_v6", cfg.Datapath.UnderlayV6)
	for _, l := range []struct{ field, hostPort string }{{"api.tcp.listen", cfg.API.TCP.Listen}, {"metrics_listen", cfg.MetricsListen}} {
		if host, _, err := net.SplitHostPort(l.hostPort); err == nil && host != "" {
			assigned(l.field, host)
		}
	}
	return errors.Join(errs...)
}
