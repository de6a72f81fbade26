package lbctl

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// jsonOptions gives the canonical proto JSON mapping with enum names. Default values are
// emitted so that scripts find every field (a port 0 or weight 0 is not a missing key).
// canonicalJSON fixes the spacing of its output.
var jsonOptions = protojson.MarshalOptions{EmitDefaultValues: true}

// print writes m in the -o format: JSON and YAML print the message itself, table calls
// the given function, which writes a human view.
func (a *app) print(m proto.Message, table func(w io.Writer)) error {
	if a.opts.output == "table" {
		table(&a.out)
		return nil
	}
	b, err := canonicalJSON(m, true)
	if err != nil {
		return err
	}
	if a.opts.output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encode YAML: %w", err)
		}
	}
	a.out.Write(b)
	if len(b) > 0 && b[len(b)-1] != '\n' {
		a.out.WriteByte('\n')
	}
	return nil
}

// printDone is print for commands that change something: the table view is one line
// saying what happened.
func (a *app) printDone(m proto.Message, format string, args ...any) error {
	return a.print(m, func(w io.Writer) { fmt.Fprintf(w, format+"\n", args...) })
}

// newTable returns an aligned-column writer; the caller writes tab-separated cells and
// flushes it (writes into a bytes.Buffer cannot fail).
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
}

// row writes one tab-separated line.
func row(w io.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(w, "\t")
		}
		fmt.Fprint(w, c)
	}
	io.WriteString(w, "\n")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// withReason appends a reason in parentheses when there is one.
func withReason(s, reason string) string {
	if reason == "" {
		return s
	}
	return s + " (" + reason + ")"
}

func formatDuration(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return d.AsDuration().String()
}

func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

// formatAge prints a duration the way gobgp's neighbor table does: hh:mm:ss, with a day
// count in front past 24 hours.
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d / time.Second)
	days, s := s/86400, s%86400
	hms := fmt.Sprintf("%02d:%02d:%02d", s/3600, s/60%60, s%60)
	if days > 0 {
		return fmt.Sprintf("%dd %s", days, hms)
	}
	return hms
}

// formatEndpoint prints addr:port, bracketing IPv6 addresses.
func formatEndpoint(addr string, port uint32) string {
	return net.JoinHostPort(addr, strconv.FormatUint(uint64(port), 10))
}

func formatPort(p uint32) string {
	if p == 0 {
		return "*"
	}
	return strconv.FormatUint(uint64(p), 10)
}

// compareAddr orders addresses numerically (IPv4 before IPv6); strings that are not
// addresses come last, in lexical order.
func compareAddr(x, y string) int {
	ax, ex := netip.ParseAddr(x)
	ay, ey := netip.ParseAddr(y)
	switch {
	case ex == nil && ey == nil:
		return ax.Compare(ay)
	case ex == nil:
		return -1
	case ey == nil:
		return 1
	}
	return strings.Compare(x, y)
}

func sortBackends(bs []*lbdv1.Backend) {
	slices.SortFunc(bs, func(x, y *lbdv1.Backend) int {
		return cmp.Or(compareAddr(x.Address, y.Address), cmp.Compare(x.Port, y.Port))
	})
}

func sortPeers(ps []*lbdv1.BgpPeer) {
	slices.SortFunc(ps, func(x, y *lbdv1.BgpPeer) int { return compareAddr(x.Address, y.Address) })
}
