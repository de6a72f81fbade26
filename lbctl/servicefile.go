package lbctl

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// A services file is what `lbctl export` writes and `lbctl apply -f` reads: YAML, one
// document per owner,
//
//	owner: ops
//	services:
//	  - name: web
//	    vip: 203.0.113.10
//	    ...
//
// each service in the API's JSON mapping with the proto field names (as `lbctl service
// get -o yaml` shows them, without output-only fields). The owner key is required; ""
// stands for the services created one by one (lbctl service create).

// ownerServices is one document of a services file.
type ownerServices struct {
	Owner    string
	Services []*lbdv1.Service
}

// fileJSON reads services in the proto JSON mapping; an unknown field is an error.
var fileJSON = protojson.UnmarshalOptions{}

// outputOnlyFields may not appear in a services file: the daemon sets them.
var outputOnlyFields = map[string]bool{"id": true, "revision": true, "status": true}
var outputOnlyBackendFields = map[string]bool{"id": true, "health": true, "table_slots": true, "tableSlots": true,
	"node_reachability": true, "nodeReachability": true}

// readServicesFile parses a services file; name is how errors refer to it.
func readServicesFile(name string, r io.Reader) ([]ownerServices, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []ownerServices
	seen := map[string]int{}
	for doc := 1; ; doc++ {
		var raw any
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		where := fmt.Sprintf("%s: document %d", name, doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if raw == nil {
			continue // an empty document, e.g. after a trailing ---
		}
		os, err := parseOwnerDoc(where, raw)
		if err != nil {
			return nil, err
		}
		if d, dup := seen[os.Owner]; dup {
			return nil, fmt.Errorf("%s: owner %q also has document %d: give each owner one document", where, os.Owner, d)
		}
		seen[os.Owner] = doc
		out = append(out, os)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no document with an owner and services", name)
	}
	return out, nil
}

func parseOwnerDoc(where string, raw any) (ownerServices, error) {
	var os ownerServices
	m, ok := raw.(map[string]any)
	if !ok {
		return os, fmt.Errorf("%s: want a mapping with the keys owner and services", where)
	}
	for k := range m {
		if k != "owner" && k != "services" {
			return os, fmt.Errorf("%s: unknown key %q (a document has owner and services)", where, k)
		}
	}
	owner, ok := m["owner"]
	if !ok {
		return os, fmt.Errorf(`%s: owner: missing (say owner: "" for the services created one by one)`, where)
	}
	if os.Owner, ok = owner.(string); !ok {
		return os, fmt.Errorf("%s: owner: want a string, got %v", where, owner)
	}
	list, ok := m["services"].([]any)
	if m["services"] != nil && !ok {
		return os, fmt.Errorf("%s: services: want a list", where)
	}
	for i, item := range list {
		field := fmt.Sprintf("%s: services[%d]", where, i)
		svc, err := parseService(field, item)
		if err != nil {
			return os, err
		}
		os.Services = append(os.Services, svc)
	}
	return os, nil
}

func parseService(field string, item any) (*lbdv1.Service, error) {
	m, ok := item.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want a mapping (a service)", field)
	}
	for k := range m {
		if outputOnlyFields[k] {
			return nil, fmt.Errorf("%s.%s: is output only: the daemon sets it (remove it from the file)", field, k)
		}
	}
	if bs, ok := m["backends"].([]any); ok {
		for j, b := range bs {
			if bm, ok := b.(map[string]any); ok {
				for k := range bm {
					if outputOnlyBackendFields[k] {
						return nil, fmt.Errorf("%s.backends[%d].%s: is output only: the daemon sets it (remove it from the file)", field, j, k)
					}
				}
			}
		}
	}
	js, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	svc := &lbdv1.Service{}
	if err := fileJSON.Unmarshal(js, svc); err != nil {
		return nil, fmt.Errorf("%s: %v", field, err)
	}
	return svc, nil
}

// fileYAML writes services in the file's form: proto field names, no default values.
var fileYAML = protojson.MarshalOptions{UseProtoNames: true}

// writeServicesFile writes services grouped by owner, owners and services sorted by name.
func writeServicesFile(w io.Writer, svcs []*lbdv1.Service) error {
	byOwner := map[string][]*lbdv1.Service{}
	for _, svc := range svcs {
		byOwner[svc.Owner] = append(byOwner[svc.Owner], svc)
	}
	owners := make([]string, 0, len(byOwner))
	for o := range byOwner {
		owners = append(owners, o)
	}
	slices.Sort(owners)
	for i, owner := range owners {
		if i > 0 {
			io.WriteString(w, "---\n")
		}
		if err := writeOwnerDoc(w, owner, byOwner[owner]); err != nil {
			return err
		}
	}
	return nil
}

func writeOwnerDoc(w io.Writer, owner string, svcs []*lbdv1.Service) error {
	slices.SortFunc(svcs, func(a, b *lbdv1.Service) int { return cmp.Compare(a.Name, b.Name) })
	items := make([]json.RawMessage, 0, len(svcs))
	for _, svc := range svcs {
		js, err := fileYAML.Marshal(fileSpec(svc))
		if err != nil {
			return fmt.Errorf("encode service %s: %w", svc.Name, err)
		}
		items = append(items, js)
	}
	doc, err := json.Marshal(struct {
		Owner    string            `json:"owner"`
		Services []json.RawMessage `json:"services"`
	}{owner, items})
	if err != nil {
		return fmt.Errorf("encode services of owner %q: %w", owner, err)
	}
	// JSON is YAML: decoded into nodes, the document keeps the proto's field order
	// (name, vip, port, ...), which a map would lose; block style reads better.
	var node yaml.Node
	if err := yaml.Unmarshal(doc, &node); err != nil {
		return fmt.Errorf("encode services of owner %q: %w", owner, err)
	}
	blockStyle(&node)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&node); err != nil {
		return fmt.Errorf("encode services of owner %q: %w", owner, err)
	}
	return enc.Close()
}

// blockStyle drops the flow style and quotes that a JSON source gave the nodes; the
// encoder quotes again the strings that need it.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// fileSpec is a service as a file holds it: the spec, without its owner (the
// document's) and the output-only fields.
func fileSpec(svc *lbdv1.Service) *lbdv1.Service {
	out := proto.Clone(svc).(*lbdv1.Service)
	out.Owner, out.Id, out.Revision, out.Status = "", 0, 0, nil
	for _, b := range out.Backends {
		b.Id, b.Health, b.TableSlots, b.NodeReachability = 0, nil, 0, lbdv1.Reachability_REACHABILITY_UNSPECIFIED
	}
	return out
}
