package lbctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// addWatchFlag adds -w/--watch to a command that can follow changes.
func (a *app) addWatchFlag(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&a.watching, "watch", "w", false,
		"after the current state, print every change as it happens, until interrupted (or until --timeout, when given)")
}

// flush writes what the command printed so far to stdout: a watch prints as it goes
// rather than when the command ends.
func (a *app) flush() error {
	if a.out.Len() == 0 {
		return nil
	}
	_, err := a.stdout.Write(a.out.Bytes())
	a.out.Reset()
	if err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// watchServices follows the services through the WatchServices stream. Each event whose
// service keep accepts is handed to show, the SYNCED marker (end of the current state)
// to synced; both print, and what they print reaches stdout at once. The watch ends
// without error when ctx reaches an explicit --timeout.
func (a *app) watchServices(ctx context.Context, owner string, keep func(*lbdv1.Service) bool,
	synced func() error, show func(*lbdv1.WatchServicesResponse) error) error {
	lb, err := a.lb()
	if err != nil {
		return err
	}
	stream, err := lb.WatchServices(ctx, &lbdv1.WatchServicesRequest{Owner: owner, StalenessEvents: true})
	if err != nil {
		return err
	}
	stale := false
	for {
		ev, err := stream.Recv()
		if err != nil {
			return watchEnded(ctx, err)
		}
		// Streams bypass the interceptor that notes answers: an UNAVAILABLE from here
		// on comes from lbd, not from failing to reach it.
		a.opts.answered = true
		// Staleness goes to stderr, as for reads; the printed events keep their layout.
		stale, ev.StaleReason = a.warnWatchStale(stale, ev.GetStaleReason()), nil
		if ev.Type == lbdv1.WatchEventType_WATCH_EVENT_TYPE_STALENESS {
			continue
		}
		if ev.Type == lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
			err = synced()
		} else if keep(ev.Service) {
			sortBackends(ev.Service.GetBackends())
			err = show(ev)
		}
		if err != nil {
			return err
		}
		if err := a.flush(); err != nil {
			return err
		}
	}
}

// warnWatchStale tells the user on stderr when what a watch shows starts being
// possibly behind the node's fleet (as the warning of a stale read says), and when it
// is current again; it returns whether it is now stale.
func (a *app) warnWatchStale(was bool, reason string) bool {
	switch {
	case reason != "" && !was && a.opts.stderr != nil:
		fmt.Fprintf(a.opts.stderr, "lbctl: warning: stale: %s\n", reason)
	case reason == "" && was && a.opts.stderr != nil:
		fmt.Fprintln(a.opts.stderr, "lbctl: no longer stale: lbd follows its fleet's services again")
	}
	return reason != ""
}

// watchEnded is what a watch returns for the error its stream's Recv gave: none when
// ctx reached an explicit --timeout (lbd, which was told the deadline, may have ended
// the stream a moment before ctx itself expired), UNAVAILABLE when lbd ended it.
func watchEnded(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return status.Error(codes.Unavailable, "lbd ended the watch")
	case status.Code(err) == codes.DeadlineExceeded && hasDeadline(ctx):
		return nil
	}
	return err
}

// printEvent prints one watch event as JSON (one line per event) or YAML (one document
// per event).
func (a *app) printEvent(m proto.Message) error {
	b, err := canonicalJSON(m, false)
	if err != nil {
		return err
	}
	if a.opts.output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encode YAML: %w", err)
		}
		a.out.WriteString("---\n")
	}
	a.out.Write(b)
	if len(b) > 0 && b[len(b)-1] != '\n' {
		a.out.WriteByte('\n')
	}
	return nil
}

// canonicalJSON is m in the proto JSON mapping, in the fixed layout of shapeJSON, on one
// line or indented by two spaces.
func canonicalJSON(m proto.Message, multiline bool) ([]byte, error) {
	raw, err := jsonOptions.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	out, err := shapeJSON(raw, m.ProtoReflect().Descriptor(), multiline)
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// serviceGetWatch is "service get NAME -w": the service as now, then again after every
// change, until interrupted. A service that does not exist is NotFound, as for get.
func (a *app) serviceGetWatch(ctx context.Context, name string) error {
	var current *lbdv1.WatchServicesResponse
	isSynced := false
	keep := func(s *lbdv1.Service) bool { return s.GetName() == name }
	synced := func() error {
		isSynced = true
		if current == nil {
			return status.Errorf(codes.NotFound, "service %q not found", name)
		}
		return a.showServiceEvent(current, true)
	}
	show := func(ev *lbdv1.WatchServicesResponse) error {
		if !isSynced {
			current = ev // the current state comes in one piece, at SYNCED
			return nil
		}
		return a.showServiceEvent(ev, false)
	}
	return a.watchServices(ctx, "", keep, synced, show)
}

// showServiceEvent prints one state of a watched service: the detail view, after a line
// that says what happened unless it is the first.
func (a *app) showServiceEvent(ev *lbdv1.WatchServicesResponse, first bool) error {
	if a.opts.output != "table" {
		return a.printEvent(ev)
	}
	if !first {
		when := a.now().UTC().Format("15:04:05.000")
		fmt.Fprintf(&a.out, "\n%s %s, revision %d:\n", when, strings.ToUpper(label(ev.Type, "-")), ev.Service.GetRevision())
	}
	if ev.Type == lbdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
		fmt.Fprintf(&a.out, "Service %q deleted.\n", ev.Service.GetName())
		return nil
	}
	writeServiceDetail(&a.out, ev.Service)
	return nil
}

// serviceListWatch is "service list -w": the services as now, sorted by name, then one
// row per change, with the event in front.
func (a *app) serviceListWatch(ctx context.Context, owner string) error {
	var initial []*lbdv1.WatchServicesResponse
	isSynced := false
	rows := &streamTable{}
	keep := func(*lbdv1.Service) bool { return true }
	synced := func() error {
		isSynced = true
		slices.SortFunc(initial, func(x, y *lbdv1.WatchServicesResponse) int {
			return strings.Compare(x.Service.GetName(), y.Service.GetName())
		})
		if a.opts.output != "table" {
			for _, ev := range initial {
				if err := a.printEvent(ev); err != nil {
					return err
				}
			}
			return a.printEvent(&lbdv1.WatchServicesResponse{Type: lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED})
		}
		// The current state is sized as one table; later rows follow its columns.
		all := [][]string{tableCells(func(w io.Writer) { writeServiceHeader(w) }, "EVENT")}
		for _, ev := range initial {
			all = append(all, serviceEventCells(ev))
		}
		rows.fit([]string{"modified"}) // the widest event
		for _, c := range all {
			rows.fit(c)
		}
		for _, c := range all {
			rows.add(&a.out, c)
		}
		return nil
	}
	show := func(ev *lbdv1.WatchServicesResponse) error {
		if !isSynced {
			initial = append(initial, ev)
			return nil
		}
		return a.showListEvent(rows, ev)
	}
	return a.watchServices(ctx, owner, keep, synced, show)
}

func (a *app) showListEvent(rows *streamTable, ev *lbdv1.WatchServicesResponse) error {
	if a.opts.output != "table" {
		return a.printEvent(ev)
	}
	rows.add(&a.out, serviceEventCells(ev))
	return nil
}

// serviceEventCells is the row of a service list watch: the event, then the list's row.
func serviceEventCells(ev *lbdv1.WatchServicesResponse) []string {
	return tableCells(func(w io.Writer) { writeServiceRow(w, ev.Service) }, label(ev.Type, "-"))
}

// tableCells returns the cells of the one row that write writes, after first.
func tableCells(write func(w io.Writer), first string) []string {
	var b bytes.Buffer
	write(&b)
	return append([]string{first}, strings.Split(strings.TrimSuffix(b.String(), "\n"), "\t")...)
}

// streamTable writes rows that arrive one at a time in columns: each cell is padded to
// the widest cell its column has had so far, so that rows printed later line up with the
// earlier ones as long as they are no wider.
type streamTable struct{ widths []int }

// fit widens the columns to hold cells, without writing them.
func (t *streamTable) fit(cells []string) {
	for i, c := range cells {
		n := utf8.RuneCountInString(c)
		if i == len(t.widths) {
			t.widths = append(t.widths, n)
		}
		t.widths[i] = max(t.widths[i], n)
	}
}

// add writes cells as one row.
func (t *streamTable) add(w io.Writer, cells []string) {
	t.fit(cells)
	var line strings.Builder
	for i, c := range cells {
		line.WriteString(c)
		if i < len(cells)-1 {
			line.WriteString(strings.Repeat(" ", t.widths[i]-utf8.RuneCountInString(c)+2))
		}
	}
	line.WriteByte('\n')
	io.WriteString(w, line.String())
}

func hasDeadline(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok
}
