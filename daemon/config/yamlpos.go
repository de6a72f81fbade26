package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// checkYAML reads data as YAML and checks it against the fields of t (their json
// names) before it is decoded: every key that no field has, and every value that a
// field's own decoder (durations, sizes) refuses, is reported with its line and column,
// which the JSON decoding behind sigs.k8s.io/yaml cannot give.
func checkYAML(data []byte, t reflect.Type) (*yaml.Node, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, err // "yaml: line N: ..."
	}
	if len(root.Content) == 0 {
		return nil, nil // an empty file
	}
	doc := root.Content[0]
	var errs []error
	checkNode(doc, t, "", &errs)
	return doc, errors.Join(errs...)
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

func checkNode(n *yaml.Node, t reflect.Type, path string, errs *[]error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
			raw, _ := json.Marshal(n.Value)
			if n.Tag == "!!int" || n.Tag == "!!float" || n.Tag == "!!bool" {
				raw = []byte(n.Value)
			}
			if err := reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(raw); err != nil {
				*errs = append(*errs, posErrorf(n, "%s: %v", path, err))
			}
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return // the decoder says what it expected
		}
		fields := jsonFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				where := "at the top level"
				if path != "" {
					where = "in " + path
				}
				known := make([]string, 0, len(fields))
				for name := range fields {
					known = append(known, name)
				}
				slices.Sort(known)
				*errs = append(*errs, posErrorf(k, "unknown field %q %s (known: %s)", k.Value, where, strings.Join(known, ", ")))
				continue
			}
			checkNode(v, ft, join(path, k.Value), errs)
		}
	case reflect.Slice, reflect.Array:
		if n.Kind == yaml.SequenceNode {
			for i, e := range n.Content {
				checkNode(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), errs)
			}
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				checkNode(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value), errs)
			}
		}
	}
}

// jsonFields maps the json names of t's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
			continue
		case name == "" && f.Anonymous:
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		case name == "":
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// typeErrorPosition gives a decoding error about a field's type the line and column of
// that field's value in doc.
func typeErrorPosition(doc *yaml.Node, err error) error {
	var te *json.UnmarshalTypeError
	if doc == nil || !errors.As(err, &te) || te.Field == "" {
		return err
	}
	n := doc
	for _, key := range strings.Split(te.Field, ".") {
		next := (*yaml.Node)(nil)
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == key {
					next = n.Content[i+1]
				}
			}
		}
		if next == nil {
			break // inside a list: the list's position is the closest
		}
		n = next
	}
	return posErrorf(n, "%s: a %s value where a %v is expected", te.Field, te.Value, te.Type)
}

func posErrorf(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("line %d, column %d: %s", n.Line, n.Column, fmt.Sprintf(format, args...))
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
