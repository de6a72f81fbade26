package lbctl

import (
	"context"
	"fmt"
	"io"
	"iter"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) serviceCommand() *cobra.Command {
	return group("service", "Create, show, change and delete services",
		a.serviceCreateCommand(),
		a.serviceGetCommand(),
		a.serviceListCommand(),
		a.serviceUpdateCommand(),
		a.serviceDeleteCommand(),
	)
}

// serviceFlags are the flags that set a service's spec, shared by create and update.
type serviceFlags struct {
	vip             string
	port            uint16
	protocol        string
	tableSize       uint32
	hashMode        string
	affinityTimeout time.Duration
	sourceRanges    []string
	noBackendAction string
	advertisePolicy string
	owner           string
	resetFlows      bool
	quicIDLen       uint32
	quicConfigID    uint32

	hcType     string
	hcPort     uint16
	hcPath     string
	hcInterval time.Duration
	hcTimeout  time.Duration
	hcRise     uint32
	hcFall     uint32
	hcStatus   string
	hcHost     string
	hcInsecure bool
}

// healthCheckDetailFlags tune a health check; they need one (--health-check).
var healthCheckDetailFlags = []string{
	"health-check-port", "health-check-path", "health-check-interval", "health-check-timeout",
	"health-check-rise", "health-check-fall", "health-check-status", "health-check-host",
	"health-check-insecure",
}

func (f *serviceFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.vip, "vip", "", "virtual IP, IPv4 or IPv6")
	fs.Uint16Var(&f.port, "port", 0, "frontend port; 0 matches every port")
	addEnumChoice(cmd, &f.protocol, "protocol", "transport protocol (create: default tcp)", lbdv1.Protocol(0))
	fs.Uint32Var(&f.tableSize, "maglev-table-size", 0, "Maglev table size, a prime; 0 takes the daemon's default")
	addEnumChoice(cmd, &f.hashMode, "hash-mode", "what picks the backend (default five-tuple)", lbdv1.HashMode(0))
	fs.DurationVar(&f.affinityTimeout, "affinity-timeout", 0, "keep a client on its backend this long while idle (whole seconds); 0 turns affinity off")
	fs.StringArrayVar(&f.sourceRanges, "source-range", nil, "client CIDR allowed to reach the VIP, repeatable; none allows all (update: replaces the list, \"\" clears it)")
	addEnumChoice(cmd, &f.noBackendAction, "no-backend-action", "new flows when no backend is usable (default reject)", lbdv1.NoBackendAction(0))
	addEnumChoice(cmd, &f.advertisePolicy, "advertise-policy", "when the VIP is advertised over BGP (default if-healthy)", lbdv1.AdvertisePolicy(0))
	fs.BoolVar(&f.resetFlows, "reset-flows-on-backend-down", false, "cut established flows of a backend that health checks mark down")
	fs.Uint32Var(&f.quicIDLen, "quic-server-id-length", 0, "UDP: route QUIC by server IDs of this many bytes (1-15) in the connection ID, given per backend with quic-id=HEX; 0 turns it off")
	fs.Uint32Var(&f.quicConfigID, "quic-config-id", 0, "UDP with QUIC routing: the config rotation codepoint of the connection IDs (0-6)")

	addEnumChoice(cmd, &f.hcType, "health-check", "active health check of the backends; none removes it", lbdv1.HealthCheckType(0))
	fs.Uint16Var(&f.hcPort, "health-check-port", 0, "port to probe; 0 probes the backend's port")
	fs.StringVar(&f.hcPath, "health-check-path", "", "HTTP(S) path (default /)")
	fs.DurationVar(&f.hcInterval, "health-check-interval", 0, "time between probes (default 5s)")
	fs.DurationVar(&f.hcTimeout, "health-check-timeout", 0, "probe timeout, below the interval (default 2s)")
	fs.Uint32Var(&f.hcRise, "health-check-rise", 0, "successes that mark a backend up (default 2)")
	fs.Uint32Var(&f.hcFall, "health-check-fall", 0, "failures that mark a backend down (default 3)")
	fs.StringVar(&f.hcStatus, "health-check-status", "", "accepted HTTP status, N or MIN-MAX (default 200-399)")
	fs.StringVar(&f.hcHost, "health-check-host", "", "HTTP Host header and TLS server name")
	fs.BoolVar(&f.hcInsecure, "health-check-insecure", false, "HTTPS: do not verify the backend's certificate")
}

// apply sets the fields of s whose flags were given on the command line, and only those:
// update relies on it to leave everything else as it was.
func (f *serviceFlags) apply(fs *pflag.FlagSet, s *lbdv1.Service) error {
	set := fs.Changed
	if set("vip") {
		s.Vip = f.vip
	}
	if set("port") {
		s.Port = uint32(f.port)
	}
	if set("protocol") {
		s.Protocol = lbdv1.Protocol(enumNumber(s.Protocol.Descriptor(), f.protocol))
	}
	if set("maglev-table-size") {
		s.MaglevTableSize = f.tableSize
	}
	if set("hash-mode") {
		s.HashMode = lbdv1.HashMode(enumNumber(s.HashMode.Descriptor(), f.hashMode))
	}
	if set("affinity-timeout") {
		s.SessionAffinity = nil
		if f.affinityTimeout != 0 {
			s.SessionAffinity = &lbdv1.SessionAffinity{Timeout: durationpb.New(f.affinityTimeout)}
		}
	}
	if set("source-range") {
		s.SourceRanges = nil
		for _, r := range f.sourceRanges {
			if r != "" {
				s.SourceRanges = append(s.SourceRanges, r)
			}
		}
	}
	if set("no-backend-action") {
		s.NoBackendAction = lbdv1.NoBackendAction(enumNumber(s.NoBackendAction.Descriptor(), f.noBackendAction))
	}
	if set("advertise-policy") {
		s.AdvertisePolicy = lbdv1.AdvertisePolicy(enumNumber(s.AdvertisePolicy.Descriptor(), f.advertisePolicy))
	}
	if set("owner") { // create only
		s.Owner = f.owner
	}
	if set("reset-flows-on-backend-down") {
		s.ResetFlowsOnBackendDown = f.resetFlows
	}
	if set("quic-server-id-length") || set("quic-config-id") {
		q := s.Quic
		if q == nil {
			q = &lbdv1.QuicRouting{}
		}
		if set("quic-server-id-length") {
			q.ServerIdLength = f.quicIDLen
		}
		if set("quic-config-id") {
			q.ConfigId = f.quicConfigID
		}
		s.Quic = q
		if q.ServerIdLength == 0 {
			if set("quic-config-id") {
				return usageErrorf("--quic-config-id needs QUIC routing: give --quic-server-id-length")
			}
			s.Quic = nil
		}
	}
	return f.applyHealthCheck(fs, s)
}

func (f *serviceFlags) applyHealthCheck(fs *pflag.FlagSet, s *lbdv1.Service) error {
	set := fs.Changed
	var detail string
	for _, name := range healthCheckDetailFlags {
		if set(name) {
			detail = name
			break
		}
	}
	if set("health-check") {
		t := lbdv1.HealthCheckType(enumNumber(lbdv1.HealthCheckType(0).Descriptor(), f.hcType))
		switch {
		case t == lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_NONE && detail != "":
			return usageErrorf("--%s contradicts --health-check none", detail)
		case t == lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_NONE:
			s.HealthCheck = nil
		case s.HealthCheck == nil:
			s.HealthCheck = &lbdv1.HealthCheck{Type: t}
		default:
			// A changed type drops the settings the new type does not have, which the
			// daemon would otherwise reject.
			hc := s.HealthCheck
			if t == lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP {
				hc.Path, hc.Host, hc.ExpectedStatusMin, hc.ExpectedStatusMax = "", "", 0, 0
			}
			if t != lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTPS {
				hc.InsecureSkipVerify = false
			}
			hc.Type = t
		}
	}
	if detail == "" {
		return nil
	}
	hc := s.HealthCheck
	if hc == nil {
		return usageErrorf("--%s needs a health check: give --health-check tcp, http or https", detail)
	}
	if set("health-check-port") {
		hc.Port = uint32(f.hcPort)
	}
	if set("health-check-path") {
		hc.Path = f.hcPath
	}
	if set("health-check-interval") {
		hc.Interval = durationpb.New(f.hcInterval)
	}
	if set("health-check-timeout") {
		hc.Timeout = durationpb.New(f.hcTimeout)
	}
	if set("health-check-rise") {
		hc.Rise = f.hcRise
	}
	if set("health-check-fall") {
		hc.Fall = f.hcFall
	}
	if set("health-check-status") {
		lo, hi, err := parseStatusRange(f.hcStatus)
		if err != nil {
			return err
		}
		hc.ExpectedStatusMin, hc.ExpectedStatusMax = lo, hi
	}
	if set("health-check-host") {
		hc.Host = f.hcHost
	}
	if set("health-check-insecure") {
		hc.InsecureSkipVerify = f.hcInsecure
	}
	return nil
}

// parseStatusRange parses "200" or "200-399".
func parseStatusRange(s string) (lo, hi uint32, err error) {
	a, b, isRange := strings.Cut(s, "-")
	if !isRange {
		b = a
	}
	x, errA := strconv.ParseUint(a, 10, 32)
	y, errB := strconv.ParseUint(b, 10, 32)
	if errA != nil || errB != nil {
		return 0, 0, usageErrorf("--health-check-status %q is not N or MIN-MAX", s)
	}
	return uint32(x), uint32(y), nil
}

func (a *app) serviceCreateCommand() *cobra.Command {
	var f serviceFlags
	var backends []string
	cmd := &cobra.Command{
		Use:   "create NAME --vip ADDRESS --port PORT [flags]",
		Short: "Create a service",
		Example: `  lbctl service create web --vip 203.0.113.10 --port 443 \
    --backend 198.18.1.10:8443 --backend 198.18.1.11:8443,weight=2 \
    --health-check http --health-check-path /healthz`,
		Args: exactArgs("NAME"),
	}
	f.register(cmd)
	// The owner is set once: the daemon refuses to change it.
	cmd.Flags().StringVar(&f.owner, "owner", "", "who manages the service; empty for operators")
	cmd.Flags().StringArrayVar(&backends, "backend", nil, "backend ADDR:PORT[,node=ADDR][,weight=N][,state=active|draining|disabled], repeatable; IPv6 as [ADDR]:PORT")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		fs := cmd.Flags()
		for _, name := range []string{"vip", "port"} {
			if !fs.Changed(name) {
				return usageErrorf("--%s is required", name)
			}
		}
		svc := &lbdv1.Service{Name: args[0], Protocol: lbdv1.Protocol_PROTOCOL_TCP}
		if err := f.apply(fs, svc); err != nil {
			return err
		}
		for _, spec := range backends {
			b, err := parseBackendSpec(spec)
			if err != nil {
				return err
			}
			svc.Backends = append(svc.Backends, b)
		}
		lb, err := a.lb()
		if err != nil {
			return err
		}
		resp, err := lb.CreateService(ctx, &lbdv1.CreateServiceRequest{Service: svc})
		if err != nil {
			return err
		}
		sortBackends(resp.Service.GetBackends())
		return a.printDone(resp.Service, "service %q created", args[0])
	})
	return cmd
}

func (a *app) serviceGetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a service with its status and backends",
		Long: `Show a service with its status and backends. With -w, show it again after every
change (by any client, or of its status: health, datapath, advertisement) until
interrupted: in JSON, one WatchServicesResponse per line; in YAML, one document each.`,
		Example:           "  lbctl service get web\n  lbctl service get web -w",
		Args:              exactArgs("NAME"),
		ValidArgsFunction: a.completeArgs(a.completeServices),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			if a.watching {
				return a.serviceGetWatch(ctx, args[0])
			}
			lb, err := a.lb()
			if err != nil {
				return err
			}
			resp, err := lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: args[0]})
			if err != nil {
				return err
			}
			svc := resp.Service
			sortBackends(svc.GetBackends())
			return a.print(svc, func(w io.Writer) { writeServiceDetail(w, svc) })
		}),
	}
	a.addWatchFlag(cmd)
	return cmd
}

func (a *app) serviceListCommand() *cobra.Command {
	var owner string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List services, sorted by name",
		Long: `List services, sorted by name. lbctl asks lbd for pages of 500 services and prints
each as it comes, so that thousands of services list in about a second; the output is
one table or one JSON or YAML document all the same.

With -w, lbctl prints the services as they are, then one row per change (the EVENT
column says added, modified or deleted) until interrupted: in JSON, one
WatchServicesResponse per line, the current services first, then a line whose type is
WATCH_EVENT_TYPE_SYNCED, then the changes; in YAML, one document each.`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			if a.watching {
				return a.serviceListWatch(ctx, owner)
			}
			lb, err := a.lb()
			if err != nil {
				return err
			}
			// Pages keep each response small on both sides; lbd answers them in name
			// order, and older lbd versions, which ignore page_size, in one response.
			p := a.newPagePrinter("services", writeServiceHeader, func(w io.Writer, m proto.Message) { writeServiceRow(w, m.(*lbdv1.Service)) })
			for page, err := range servicePages(ctx, lb, owner) {
				if err != nil {
					return err
				}
				items := make([]proto.Message, len(page))
				for i, s := range page {
					sortBackends(s.Backends)
					items[i] = s
				}
				if err := p.add(items); err != nil {
					return err
				}
			}
			p.close()
			return nil
		}),
	}
	cmd.Flags().StringVar(&owner, "owner", "", "only services of this owner")
	a.addWatchFlag(cmd)
	return cmd
}

func (a *app) serviceUpdateCommand() *cobra.Command {
	var f serviceFlags
	cmd := &cobra.Command{
		Use:   "update NAME [flags]",
		Short: "Change a service's settings; only the flags given change",
		Long: `Change a service's settings. Only the flags given change; everything else,
backends included, stays as it is. The update applies only if nobody changed the service
since lbctl read it; otherwise it fails with FailedPrecondition and can be run again.`,
		Example:           `  lbctl service update web --affinity-timeout 1h --source-range 198.51.100.0/24`,
		Args:              exactArgs("NAME"),
		ValidArgsFunction: a.completeArgs(a.completeServices),
	}
	f.register(cmd)
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		if !anyLocalFlagSet(cmd) {
			return usageErrorf("nothing to change: give at least one flag")
		}
		lb, err := a.lb()
		if err != nil {
			return err
		}
		got, err := lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: args[0]})
		if err != nil {
			return err
		}
		svc := got.Service
		if err := f.apply(cmd.Flags(), svc); err != nil {
			return err
		}
		resp, err := lb.UpdateService(ctx, &lbdv1.UpdateServiceRequest{Service: svc, ExpectedRevision: svc.Revision})
		if err != nil {
			return err
		}
		sortBackends(resp.Service.GetBackends())
		return a.printDone(resp.Service, "service %q updated (revision %d)", args[0], resp.Service.GetRevision())
	})
	return cmd
}

func (a *app) serviceDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "delete NAME",
		Short:             "Delete a service and its backends",
		Args:              exactArgs("NAME"),
		ValidArgsFunction: a.completeArgs(a.completeServices),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			lb, err := a.lb()
			if err != nil {
				return err
			}
			resp, err := lb.DeleteService(ctx, &lbdv1.DeleteServiceRequest{Name: args[0]})
			if err != nil {
				return err
			}
			return a.printDone(resp, "service %q deleted", args[0])
		}),
	}
}

// servicePages lists the services of owner (all if empty) page by page, one page
// ahead of the caller: the next page is on its way while the caller prints this one.
func servicePages(ctx context.Context, lb lbdv1.LoadBalancerServiceClient, owner string) iter.Seq2[[]*lbdv1.Service, error] {
	return func(yield func([]*lbdv1.Service, error) bool) {
		type page struct {
			svcs []*lbdv1.Service
			err  error
		}
		// stop ends the fetching when the caller stops early; the RPCs themselves end
		// with ctx, and their error reaches the caller.
		stop := make(chan struct{})
		defer close(stop)
		pages := make(chan page, 1)
		go func() {
			defer close(pages)
			req := &lbdv1.ListServicesRequest{Owner: owner, PageSize: listPageSize}
			for {
				resp, err := lb.ListServices(ctx, req)
				select {
				case pages <- page{resp.GetServices(), err}:
				case <-stop:
					return
				}
				if err != nil || resp.NextPageToken == "" {
					return
				}
				req.PageToken = resp.NextPageToken
			}
		}()
		for p := range pages {
			if !yield(p.svcs, p.err) || p.err != nil {
				return
			}
		}
	}
}

func writeServiceHeader(w io.Writer) {
	row(w, "NAME", "VIP", "PORT", "PROTOCOL", "BACKENDS", "STATE", "ADVERTISED", "OWNER")
}

func writeServiceRow(w io.Writer, s *lbdv1.Service) {
	row(w, s.Name, s.Vip, formatPort(s.Port), label(s.Protocol, "-"),
		fmt.Sprintf("%d/%d", s.GetStatus().GetUsableBackends(), len(s.Backends)),
		label(s.GetStatus().GetState(), "-"), yesNo(s.GetStatus().GetAdvertised()), dash(s.Owner))
}

func writeServiceDetail(w io.Writer, s *lbdv1.Service) {
	st := s.GetStatus()
	t := newTable(w)
	row(t, "Name:", s.Name)
	row(t, "VIP:", s.Vip)
	row(t, "Port:", formatPort(s.Port))
	row(t, "Protocol:", label(s.Protocol, "-"))
	row(t, "Owner:", dash(s.Owner))
	row(t, "ID:", s.Id)
	row(t, "Revision:", s.Revision)
	row(t, "State:", withReason(label(st.GetState(), "-"), st.GetReason()))
	row(t, "Usable backends:", fmt.Sprintf("%d of %d", st.GetUsableBackends(), len(s.Backends)))
	row(t, "Advertised:", withReason(yesNo(st.GetAdvertised()), st.GetAdvertiseReason()))
	row(t, "Updated:", formatTime(st.GetUpdateTime()))
	row(t, "Maglev table size:", dashZero(s.MaglevTableSize))
	row(t, "Hash mode:", label(s.HashMode, "five-tuple"))
	row(t, "Session affinity:", formatAffinity(s.SessionAffinity))
	row(t, "Source ranges:", formatRanges(s.SourceRanges))
	row(t, "Health check:", formatHealthCheck(s.HealthCheck))
	row(t, "No backend action:", label(s.NoBackendAction, "reject"))
	row(t, "Advertise policy:", label(s.AdvertisePolicy, "if-healthy"))
	row(t, "Reset flows on backend down:", yesNo(s.ResetFlowsOnBackendDown))
	row(t, "QUIC routing:", formatQUIC(s.Quic))
	t.Flush()
	if len(s.Backends) == 0 {
		fmt.Fprintln(w, "\nNo backends.")
		return
	}
	fmt.Fprintln(w)
	writeBackendTable(w, s.Backends)
}

func dashZero(n uint32) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(uint64(n), 10)
}

func formatQUIC(q *lbdv1.QuicRouting) string {
	if q == nil {
		return "none"
	}
	return fmt.Sprintf("by server ID: %d bytes, config rotation %d", q.ServerIdLength, q.ConfigId)
}

func formatAffinity(a *lbdv1.SessionAffinity) string {
	if a == nil {
		return "none"
	}
	return "client address, timeout " + formatDuration(a.Timeout)
}

func formatRanges(rs []string) string {
	if len(rs) == 0 {
		return "any"
	}
	return strings.Join(rs, ", ")
}

func formatHealthCheck(hc *lbdv1.HealthCheck) string {
	if hc == nil {
		return "none"
	}
	parts := []string{label(hc.Type, "-")}
	if hc.Port != 0 {
		parts = append(parts, fmt.Sprintf("port %d", hc.Port))
	}
	if hc.Path != "" {
		parts = append(parts, "path "+hc.Path)
	}
	if hc.Host != "" {
		parts = append(parts, "host "+hc.Host)
	}
	if hc.ExpectedStatusMin != 0 || hc.ExpectedStatusMax != 0 {
		parts = append(parts, fmt.Sprintf("status %d-%d", hc.ExpectedStatusMin, hc.ExpectedStatusMax))
	}
	if hc.Interval != nil {
		parts = append(parts, "every "+formatDuration(hc.Interval))
	}
	if hc.Timeout != nil {
		parts = append(parts, "timeout "+formatDuration(hc.Timeout))
	}
	if hc.Rise != 0 || hc.Fall != 0 {
		parts = append(parts, fmt.Sprintf("rise %d fall %d", hc.Rise, hc.Fall))
	}
	if hc.InsecureSkipVerify {
		parts = append(parts, "insecure")
	}
	return strings.Join(parts, ", ")
}

// anyLocalFlagSet says whether a flag of cmd itself (not a global one) was given.
func anyLocalFlagSet(cmd *cobra.Command) bool {
	set := false
	cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) { set = set || f.Changed })
	return set
}
