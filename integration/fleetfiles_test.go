//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// fleetServices lists a daemon's services by name, without their status.
func (tb *testbed) fleetServices(t *testing.T, d *daemon) map[string]*lbdv1.Service {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := d.lb.ListServices(ctx, &lbdv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*lbdv1.Service{}
	for _, svc := range resp.GetServices() {
		out[svc.Name] = store.SpecOnly(svc)
	}
	return out
}

// sameSpec compares two services without IDs, revisions and status: what a services
// file and a change say of a service.
func sameSpec(a, b *lbdv1.Service) bool {
	clean := func(s *lbdv1.Service) *lbdv1.Service {
		if s == nil {
			return nil
		}
		s = store.SpecOnly(s)
		s.Id, s.Revision = 0, 0
		for _, be := range s.Backends {
			be.Id = 0
		}
		return s
	}
	return proto.Equal(clean(a), clean(b))
}

// fleetRevision is the fleet's revision a daemon's services reflect.
func (d *daemon) fleetRevision(t *testing.T) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := lbdv1.NewFleetServiceClient(d.conn).GetFleet(ctx, &lbdv1.GetFleetRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRevision()
}

// shell runs a bash command line with stdin and returns its exit code and output.
func (tb *testbed) shell(t *testing.T, stdin, line string) (int, string, string) {
	t.Helper()
	cmd := exec.Command("bash", "-c", line)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatalf("bash -c %q: %v", line, err)
	return 0, "", ""
}

// applyAnswer decodes what lbctl apply -f or diff -f printed with -o json.
func applyAnswer(t *testing.T, code int, out, errOut string) *lbdv1.ApplyServicesResponse {
	t.Helper()
	r := &lbdv1.ApplyServicesResponse{}
	if code != 0 || protojson.Unmarshal([]byte(out), r) != nil {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	return r
}

// editServicesFile edits what lbctl export wrote (the services of owner ""): prop
// removed, filed added (web's copy on another VIP), the weight of web's first backend
// changed.
func editServicesFile(t *testing.T, exported string) string {
	t.Helper()
	var doc struct {
		Owner    string           `json:"owner"`
		Services []map[string]any `json:"services"`
	}
	if err := yaml.UnmarshalStrict([]byte(exported), &doc); err != nil {
		t.Fatalf("lbctl export wrote %q: %v", exported, err)
	}
	var svcs []map[string]any
	var web map[string]any
	for _, svc := range doc.Services {
		switch svc["name"] {
		case "prop":
			continue
		case "web":
			web = svc
		}
		svcs = append(svcs, svc)
	}
	if web == nil || len(svcs) != len(doc.Services)-1 {
		t.Fatalf("lbctl export wrote no web or no prop: %s", exported)
	}
	filed := maps.Clone(web)
	filed["name"], filed["vip"] = "filed", "203.0.113.23"
	be := web["backends"].([]any)[0].(map[string]any)
	be["weight"] = 7
	doc.Services = append(svcs, filed)
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// changeNames says what changes did, as lbctl's marks.
func changeNames(cs []*lbdv1.ServiceChange) string {
	var out []string
	for _, c := range cs {
		out = append(out, map[lbdv1.ServiceChangeType]string{
			lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_CREATED: "+",
			lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_UPDATED: "~",
			lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_DELETED: "-",
		}[c.Type]+c.Name)
	}
	return strings.Join(out, " ")
}
