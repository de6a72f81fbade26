package lbctl

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) versionCommand() *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show lbctl's version and the server's",
		Long: `Show lbctl's version and the server's. When lbd cannot be reached, lbctl still prints
its own version, says so (JSON: serverError instead of serverVersion) and exits 0.`,
		Args: exactArgs(),
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "show only lbctl's version; do not contact the server")
	cmd.RunE = a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
		fields := map[string]any{"clientVersion": clientVersion()}
		if !clientOnly {
			nc, err := a.node()
			if err != nil {
				return err
			}
			resp, err := nc.GetNode(ctx, &lbdv1.GetNodeRequest{})
			switch code := status.Code(err); {
			case err == nil:
				fields["serverVersion"] = resp.GetNode().GetVersion()
			case (code == codes.Unavailable || code == codes.DeadlineExceeded) && !a.opts.answered:
				// No daemon to ask is an answer too: the client's version still holds.
				fields["serverError"] = fmt.Sprintf("cannot reach lbd at %s: %s", a.opts.server, status.Convert(err).Message())
			default:
				return err
			}
		}
		msg, err := structpb.NewStruct(fields)
		if err != nil {
			return fmt.Errorf("build version message: %w", err)
		}
		return a.print(msg, func(w io.Writer) {
			t := newTable(w)
			row(t, "Client:", fields["clientVersion"])
			if v, ok := fields["serverVersion"]; ok {
				row(t, "Server:", dash(v.(string)))
			}
			if v, ok := fields["serverError"]; ok {
				row(t, "Server:", "unreachable ("+v.(string)+")")
			}
			t.Flush()
		})
	})
	return cmd
}
