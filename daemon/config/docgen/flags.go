package main

import (
	"bytes"
	"flag"
	"fmt"
	"strings"

	"github.com/lbd-dev/lbd/daemon/lbd"
)

// flagsReference renders the section of config.md that lists lbd's command-line flags,
// from the flag set lbd parses.
func flagsReference() string {
	var b bytes.Buffer
	b.WriteString("\n## Command-line flags\n\n")
	b.WriteString("`lbd --help` lists the same flags. A flag that names a key overrides the file's value; `--flag` and `-flag` are the same.\n\n")
	b.WriteString("| flag | type | description |\n|---|---|---|\n")
	lbd.FlagSet().VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		switch typ {
		case "":
			typ = "bool"
		case "value": // lbd's repeatable flags
			typ = "list"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", f.Name, typ, strings.ReplaceAll(usage, "|", "\\|"))
	})
	return b.String()
}
