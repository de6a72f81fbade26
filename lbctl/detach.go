package lbctl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// errNotConfirmed ends node detach when the operator did not answer yes.
var errNotConfirmed = errors.New("detach not confirmed; nothing changed (--yes skips the question)")

func (a *app) nodeDetachCommand() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "detach",
		Short: "Remove the datapath from the node's interfaces: it stops forwarding",
		Long: `Remove the datapath programs from the node's interfaces and delete their pins.
The node stops forwarding at once, established flows included; drain it first (lbctl node
drain) to move new flows elsewhere. The daemon keeps running with its configuration.
lbctl asks for confirmation on stdin unless --yes is given.`,
		Args: exactArgs(),
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		if !yes {
			confirmed, err := a.confirm(cmd.ErrOrStderr(),
				"Detach the datapath? This node stops forwarding, established flows included. [y/N] ")
			if err != nil {
				return err
			}
			if !confirmed {
				return errNotConfirmed
			}
		}
		nc, err := a.node()
		if err != nil {
			return err
		}
		resp, err := nc.DetachNode(ctx, &lbdv1.DetachNodeRequest{})
		if err != nil {
			return err
		}
		return a.print(resp.Node, func(w io.Writer) {
			fmt.Fprintln(w, "datapath detached: the node no longer forwards")
			fmt.Fprintln(w)
			a.writeNodeDetail(w, resp.Node)
		})
	})
	return cmd
}

// confirm writes question to w (stderr: stdout holds only results) and reads one line of
// stdin; only "y" or "yes" confirm. Stdin ending without an answer is a no.
func (a *app) confirm(w io.Writer, question string) (bool, error) {
	fmt.Fprint(w, question)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read answer from stdin: %w", err)
	}
	if !strings.HasSuffix(line, "\n") {
		// Stdin ended mid-line, so no newline was echoed after the question: end its line.
		fmt.Fprintln(w)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}
