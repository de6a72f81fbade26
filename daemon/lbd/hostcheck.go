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
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					local[ip.Unmap()] = true
				}
			}
		}
	}
	var errs []error
	for i, name := range cfg.Datapath.Interfaces {
		if !names[name] {
			errs = append(errs, fmt.Errorf("datapath.interfaces[%d]: interface %q does not exist on this host", i, name))
		}
	}
	assigned := func(field string, addr netip.Addr) {
		if !addr.IsValid() || addr.IsUnspecified() || local[addr.Unmap()] {
			return // the configuration's own validation speaks of unparsable addresses
		}
		errs = append(errs, fmt.Errorf("%s: %s is not assigned to any interface of this host", field, addr))
	}
	da, _ := cfg.Datapath.Addrs()
	assigned("datapath.underlay_v4", da.Underlay4)
	assigned("datapath.underlay_v6", da.Underlay6)
	for _, l := range []struct{ field, hostPort string }{{"api.tcp.listen", cfg.API.TCP.Listen}, {"metrics_listen", cfg.MetricsListen}} {
		// Listen addresses are host:port strings of the configuration file, which only
		// net.Listen reads: this check is their one parse (configuration input).
		if host, _, err := net.SplitHostPort(l.hostPort); err == nil && host != "" {
			if addr, err := netip.ParseAddr(host); err == nil {
				assigned(l.field, addr)
			}
		}
	}
	return errors.Join(errs...)
}
