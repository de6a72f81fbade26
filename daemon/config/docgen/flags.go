package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/lbd-dev/lbd/daemon/lbd"
	"github.com/spf13/pflag"
)

// flagsReference renders the section of config.md that lists lbd's command-line flags,
// from the flag set lbd parses.
func flagsReference() string {
	var b bytes.Buffer
	b.WriteString("\n## Command-line flags\n\n")
	b.WriteString("`lbd --help` lists the same flags. A flag that names a key overrides the file's value; `--flag` and `-flag` are the same.\n\n")
	b.WriteString("| flag | type | description |\n|---|---|---|\n")
	lbd.Command().Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", f.Name, f.Value.Type(), strings.ReplaceAll(f.Usage, "|", "\\|"))
	})
	return b.String()
}
