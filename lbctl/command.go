package lbctl

import (
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// Command returns lbctl's command tree, the one Main runs, for its manual pages and
// documentation checks. Running it is Main's job: this tree writes nowhere.
func Command() *cobra.Command {
	a := &app{stdin: os.Stdin, now: time.Now}
	return a.rootCommand(io.Discard)
}
