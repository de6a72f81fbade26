package lbctl

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"text/tabwriter"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// listPageSize is how many items lbctl asks for per page of a list.
const listPageSize = 500

// pagePrinter prints a list that arrives in pages, one item at a time, in the -o format:
// a table, or the list response message (its items under field, the JSON name of the
// repeated field) in JSON or YAML, as print would write it had the list come in one
// message. Nothing is kept of an item once it is printed.
type pagePrinter struct {
	a     *app
	field string
	row   func(w io.Writer, m proto.Message)
	tab   *tabwriter.Writer
	n     int
}

// newPagePrinter starts a list; header writes the table's header row.
func (a *app) newPagePrinter(field string, header func(w io.Writer), row func(w io.Writer, m proto.Message)) *pagePrinter {
	p := &pagePrinter{a: a, field: field, row: row}
	switch a.opts.output {
	case "table":
		p.tab = newTable(&a.out)
		header(p.tab)
	case "json":
		fmt.Fprintf(&a.out, "{\n  %q: [", field)
	}
	return p
}

// add prints a page of items. JSON and YAML are encoded on every CPU at once: the
// encoding, not the transfer, is most of the time of a large list.
func (p *pagePrinter) add(items []proto.Message) error {
	if p.tab != nil {
		for _, m := range items {
			p.row(p.tab, m)
		}
		p.n += len(items)
		return nil
	}
	enc := make([][]byte, len(items))
	errs := make([]error, len(items))
	workers := min(runtime.GOMAXPROCS(0), len(items))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(items); i += workers {
				enc[i], errs[i] = p.encode(items[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	out := &p.a.out
	for _, b := range enc {
		switch {
		case p.a.opts.output == "yaml":
			if p.n == 0 {
				fmt.Fprintf(out, "%s:\n", p.field)
			}
			indentItem(out, b, "- ", "  ")
		default:
			if p.n > 0 {
				out.WriteByte(',')
			}
			out.WriteByte('\n')
			indentItem(out, bytes.TrimRight(b, "\n"), "    ", "    ")
		}
		p.n++
	}
	return nil
}

// encode is one item in the output format (JSON or YAML).
func (p *pagePrinter) encode(m proto.Message) ([]byte, error) {
	b, err := canonicalJSON(m, true)
	if err != nil {
		return nil, err
	}
	if p.a.opts.output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return nil, fmt.Errorf("encode YAML: %w", err)
		}
	}
	return b, nil
}

// indentItem writes the lines of b, the first after first and the others after rest.
func indentItem(out *bytes.Buffer, b []byte, first, rest string) {
	for i, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if i == 0 {
			out.WriteString(first)
		} else {
			out.WriteString(rest)
		}
		out.Write(line)
	}
}

// close ends the list. The response message's other field is its next_page_token, empty
// since the list is whole.
func (p *pagePrinter) close() {
	out := &p.a.out
	switch {
	case p.tab != nil:
		p.tab.Flush()
	case p.a.opts.output == "json":
		if p.n > 0 {
			out.WriteString("\n  ")
		}
		out.WriteString("],\n  \"nextPageToken\": \"\"\n}\n")
	default:
		if p.n == 0 {
			fmt.Fprintf(out, "%s: []\n", p.field)
		}
		out.WriteString("nextPageToken: \"\"\n")
	}
}
