package lbctl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lbd-dev/lbd/daemon/apitest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// watchRun is an lbctl watch running in the background; its stdout arrives line by line.
type watchRun struct {
	lines chan timedLine
	done  chan result
}

type timedLine struct {
	text string
	at   time.Time
}

func startWatch(t *testing.T, server string, args ...string) *watchRun {
	t.Helper()
	pr, pw := io.Pipe()
	w := &watchRun{lines: make(chan timedLine, 1000), done: make(chan result, 1)}
	go func() {
		s := bufio.NewScanner(pr)
		for s.Scan() {
			w.lines <- timedLine{s.Text(), time.Now()}
		}
		close(w.lines)
	}()
	go func() {
		var errOut strings.Builder
		code := Main(append([]string{"--server", server}, args...), strings.NewReader(""), pw, &errOut)
		pw.Close()
		w.done <- result{code: code, stderr: errOut.String()}
	}()
	t.Cleanup(func() { pr.Close() })
	return w
}

// line returns the next line, failing after a generous bound.
func (w *watchRun) line(t *testing.T) timedLine {
	t.Helper()
	select {
	case l, open := <-w.lines:
		if !open {
			t.Fatal("watch output ended")
		}
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("no line within 20 s")
	}
	panic("unreachable")
}

// next returns the next line that contains want, failing after a generous bound.
func (w *watchRun) next(t *testing.T, want string) timedLine {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l, open := <-w.lines:
			if !open {
				t.Fatalf("watch output ended before a line with %q", want)
			}
			if strings.Contains(l.text, want) {
				return l
			}
		case <-deadline:
			t.Fatalf("no line with %q within 20 s", want)
		}
	}
}

// TestServiceGetWatch changes a service from another client and measures how long the
// change takes to be printed by "service get -w".
func TestServiceGetWatch(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80", "--backend", "198.18.1.10:80")
	ok(t, srv, "service", "create", "other", "--vip", "203.0.113.11", "--port", "80")

	w := startWatch(t, srv, "service", "get", "web", "-w", "-o", "json", "--timeout", "30s")
	var first lbdv1.WatchServicesResponse
	if err := protojson.Unmarshal([]byte(w.next(t, `"service"`).text), &first); err != nil {
		t.Fatalf("first line is not a WatchServicesResponse: %v", err)
	}
	if first.Service.GetName() != "web" || first.Service.GetBackends()[0].GetWeight() != 1 {
		t.Fatalf("first event: %v", &first)
	}
	var lat []time.Duration
	for i := 2; i <= 11; i++ {
		// Another service's change is not printed: the next line is web's.
		ok(t, srv, "service", "update", "other", "--port", itoa(1000+i))
		start := time.Now()
		ok(t, srv, "backend", "set-weight", "web", "198.18.1.10:80", itoa(i))
		l := w.line(t)
		if !strings.Contains(l.text, `"weight":`+itoa(i)+`,`) {
			t.Fatalf("line after weight %d: %q", i, l.text)
		}
		var ev lbdv1.WatchServicesResponse
		if err := protojson.Unmarshal([]byte(l.text), &ev); err != nil {
			t.Fatalf("line %q: %v", l.text, err)
		}
		if ev.Type != lbdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED || ev.Service.GetName() != "web" {
			t.Fatalf("event %v, want web MODIFIED", &ev)
		}
		lat = append(lat, l.at.Sub(start))
	}
	slices.Sort(lat)
	t.Logf("change printed after: min %v, median %v, max %v (10 changes, from the change's call to the printed line)", lat[0], lat[len(lat)/2], lat[len(lat)-1])

	ok(t, srv, "service", "delete", "web")
	if l := w.line(t); !strings.Contains(l.text, `"WATCH_EVENT_TYPE_DELETED"`) {
		t.Errorf("after delete: %q", l.text)
	}
	if len(w.lines) > 0 {
		t.Errorf("watch of web printed more: %q", (<-w.lines).text)
	}
}

// TestWatchTimeout: a --timeout given with -w ends the watch, which is its normal end.
func TestWatchTimeout(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80")
	start := time.Now()
	r := lbctl(t, srv, "service", "list", "-w", "-o", "json", "--timeout", "1s")
	if r.code != ExitOK || r.stderr != "" || !strings.HasSuffix(r.stdout, `{"type":"WATCH_EVENT_TYPE_SYNCED"}`+"\n") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 0, the services and SYNCED", r.code, r.stdout, r.stderr)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("watch with --timeout 1s ended after %v", d)
	}
}

// TestServiceGetWatchTable shows the detail view again after a change, headed by what
// happened; a missing service is NotFound, as for get.
func TestServiceGetWatchTable(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80", "--backend", "198.18.1.10:80")
	w := startWatch(t, srv, "service", "get", "web", "-w", "--timeout", "30s")
	w.next(t, "Name:")
	w.next(t, "198.18.1.10")
	ok(t, srv, "backend", "drain", "web", "198.18.1.10:80")
	w.next(t, "MODIFIED, revision 2:")
	if l := w.next(t, "198.18.1.10"); !strings.Contains(l.text, "draining") {
		t.Errorf("backend row after drain: %q", l.text)
	}

	r := lbctl(t, srv, "service", "get", "nope", "-w")
	if r.code != ExitError || r.stdout != "" || r.stderr != "lbctl: service \"nope\" not found (code: NotFound)\n" {
		t.Errorf("watch of a missing service: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestServiceListWatch prints the current services sorted, then a row per change.
func TestServiceListWatch(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "b-web", "--vip", "203.0.113.10", "--port", "80")
	ok(t, srv, "service", "create", "a-web", "--vip", "203.0.113.11", "--port", "80")
	w := startWatch(t, srv, "service", "list", "-w", "--timeout", "30s")
	header := w.next(t, "EVENT")
	if !strings.HasPrefix(fields(header.text), "EVENT NAME VIP") {
		t.Errorf("header %q", header.text)
	}
	first, second := <-w.lines, <-w.lines
	if !strings.HasPrefix(fields(first.text), "added a-web 203.0.113.11") || !strings.HasPrefix(fields(second.text), "added b-web 203.0.113.10") {
		t.Errorf("rows %q, %q: want a-web, then b-web", first.text, second.text)
	}
	col := strings.Index(header.text, "VIP")
	ok(t, srv, "service", "create", "c-web", "--vip", "203.0.113.12", "--port", "80")
	// Later rows line up with the first ones.
	if l := w.next(t, "c-web"); !strings.HasPrefix(fields(l.text), "added c-web 203.0.113.12") || strings.Index(l.text, "203.") != col {
		t.Errorf("row of the new service %q, VIP not in the column at %d", l.text, col)
	}
	ok(t, srv, "service", "delete", "a-web")
	if l := w.next(t, "a-web"); !strings.HasPrefix(fields(l.text), "deleted a-web") || strings.Index(l.text, "203.") != col {
		t.Errorf("row of the deleted service %q", l.text)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// fields are the cells of a table row.
func fields(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestCanonicalJSON: JSON output has one fixed layout (protojson varies its spacing on
// purpose), the same as encoding/json's indentation of it, and the version's exactly.
func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80", "--backend", "198.18.1.10:80")
	for _, args := range [][]string{
		{"service", "get", "web", "-o", "json"},
		{"service", "list", "-o", "json"},
		{"backend", "list", "web", "-o", "json"},
	} {
		out := ok(t, srv, args...)
		var compact, indented bytes.Buffer
		if err := json.Compact(&compact, []byte(out)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if err := json.Indent(&indented, compact.Bytes(), "", "  "); err != nil {
			t.Fatal(err)
		}
		if want := indented.String() + "\n"; out != want {
			t.Errorf("%v printed\n%s\nwant the layout\n%s", args, out, want)
		}
	}
	if got, want := ok(t, srv, "version", "--client", "-o", "json"), "{\n  \"clientVersion\": \""+clientVersion()+"\"\n}\n"; got != want {
		t.Errorf("version --client -o json: %q, want %q", got, want)
	}
}

// TestNumbersWhereSafe: 64-bit integers come out as JSON numbers up to 2^53 and as
// strings above it, in nested messages, lists and the service's own fields; protobuf
// reads the result back unchanged.
func TestNumbersWhereSafe(t *testing.T) {
	t.Parallel()
	in := &lbdv1.GetStatsResponse{Reasons: []*lbdv1.Counter{
		{Name: "a<b&c", Packets: 12, Bytes: 1 << 53},
		{Name: "big", Packets: 1<<53 + 1, Bytes: 1<<64 - 1},
		{Name: `q"uote\, "x":{[`, Packets: 0},
	}}
	b, err := canonicalJSON(in, false)
	if err != nil {
		t.Fatal(err)
	}
	want := `"reasons":[{"name":"a<b&c","packets":12,"bytes":9007199254740992},` +
		`{"name":"big","packets":"9007199254740993","bytes":"18446744073709551615"},` +
		`{"name":"q\"uote\\, \"x\":{[","packets":0,"bytes":0}]`
	if !strings.Contains(string(b), want) {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	var back lbdv1.GetStatsResponse
	if err := protojson.Unmarshal(b, &back); err != nil || !proto.Equal(&back, in) {
		t.Errorf("read back: %v, %v", &back, err)
	}

	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80")
	if out := ok(t, srv, "service", "get", "web", "-o", "json"); !strings.Contains(out, "\n  \"revision\": 1,\n") {
		t.Errorf("service get -o json: revision is not the number 1:\n%s", out)
	}
}
