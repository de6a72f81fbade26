package lbctl

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) backendCommand() *cobra.Command {
	const (
		active   = lbdv1.BackendState_BACKEND_STATE_ACTIVE
		draining = lbdv1.BackendState_BACKEND_STATE_DRAINING
		disabled = lbdv1.BackendState_BACKEND_STATE_DISABLED
	)
	return group("backend", "Add, remove and change the backends of a service",
		a.backendListCommand(),
		a.backendAddCommand(),
		a.backendRemoveCommand(),
		a.backendDrainCommand(),
		a.backendStateCommand("undrain", "Send new flows to a draining backend again",
			active, disabled),
		a.backendStateCommand("disable", "Take a backend out entirely: new and established flows stop",
			disabled),
		a.backendStateCommand("enable", "Send flows to a disabled backend again",
			active, draining),
		a.backendSetWeightCommand(),
		a.backendSetQUICServerIDCommand(),
	)
}

func (a *app) backendListCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "list SERVICE",
		Short:             "List a service's backends, sorted by address and port",
		Args:              exactArgs("SERVICE"),
		ValidArgsFunction: a.completeArgs(a.completeServices),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			lb, err := a.lb()
			if err != nil {
				return err
			}
			resp, err := lb.ListBackends(ctx, &lbdv1.ListBackendsRequest{ServiceName: args[0]})
			if err != nil {
				return err
			}
			sortBackends(resp.Backends)
			return a.print(resp, func(w io.Writer) { writeBackendTable(w, resp.Backends) })
		}),
	}
}

func (a *app) backendAddCommand() *cobra.Command {
	var node, state, quicID string
	var weight uint32
	cmd := &cobra.Command{
		Use:               "add SERVICE ADDR:PORT [flags]",
		Short:             "Add a backend to a service",
		Example:           "  lbctl backend add web 198.18.1.12:8443 --weight 2\n  lbctl backend add web6 '[2001:db8::12]:8443' --node 198.18.1.12",
		Args:              exactArgs("SERVICE", "ADDR:PORT"),
		ValidArgsFunction: a.completeArgs(a.completeServices),
	}
	cmd.Flags().StringVar(&node, "node", "", "address of the node hosting the backend (outer header); default the backend address")
	cmd.Flags().Uint32Var(&weight, "weight", 0, "relative weight, 1-256 (default 1)")
	addEnumChoice(cmd, &state, "state", "initial state (default active)", lbdv1.BackendState(0))
	cmd.Flags().StringVar(&quicID, "quic-server-id", "", "the server ID (hex) its QUIC server encodes in its connection IDs (services with QUIC routing)")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		ap, err := parseAddrPort(args[1])
		if err != nil {
			return err
		}
		if cmd.Flags().Changed("weight") && weight == 0 {
			return usageErrorf("--weight 0 is not a weight (1-256); add the backend with --state draining to send it no new flows")
		}
		sid, err := hex.DecodeString(quicID)
		if err != nil {
			return usageErrorf("--quic-server-id %q is not hex", quicID)
		}
		b := &lbdv1.Backend{Address: ap.Addr().String(), Port: uint32(ap.Port()), NodeAddress: node, Weight: weight, QuicServerId: sid}
		if cmd.Flags().Changed("state") {
			b.State = lbdv1.BackendState(enumNumber(b.State.Descriptor(), state))
		}
		lb, err := a.lb()
		if err != nil {
			return err
		}
		resp, err := lb.CreateBackend(ctx, &lbdv1.CreateBackendRequest{ServiceName: args[0], Backend: b})
		if err != nil {
			return err
		}
		return a.printDone(resp.Backend, "backend %s added to service %q", ap, args[0])
	})
	return cmd
}

func (a *app) backendRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "remove SERVICE ADDR:PORT",
		Short:             "Remove a backend from a service",
		Args:              exactArgs("SERVICE", "ADDR:PORT"),
		ValidArgsFunction: a.completeArgs(a.completeServices, a.completeBackends),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			ap, err := parseAddrPort(args[1])
			if err != nil {
				return err
			}
			lb, err := a.lb()
			if err != nil {
				return err
			}
			resp, err := lb.DeleteBackend(ctx, &lbdv1.DeleteBackendRequest{
				ServiceName: args[0], Address: ap.Addr().String(), Port: uint32(ap.Port()),
			})
			if err != nil {
				return err
			}
			return a.printDone(resp, "backend %s removed from service %q", ap, args[0])
		}),
	}
}

// backendStateCommand sets a backend's state. A backend in one of the refused states is
// left alone: "undrain" must not revive a disabled backend, nor "enable" a draining one.
// The server checks the current state and changes it in one step, so a concurrent change
// is never decided on from a stale read.
func (a *app) backendStateCommand(use, short string, to lbdv1.BackendState, refuse ...lbdv1.BackendState) *cobra.Command {
	return &cobra.Command{
		Use:               use + " SERVICE ADDR:PORT",
		Short:             short,
		Args:              exactArgs("SERVICE", "ADDR:PORT"),
		ValidArgsFunction: a.completeArgs(a.completeServices, a.completeBackends),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			return a.setBackendState(ctx, use, args[0], args[1], to, refuse...)
		}),
	}
}

// setBackendState is the work of backendStateCommand.
func (a *app) setBackendState(ctx context.Context, use, service, addrPort string, to lbdv1.BackendState, refuse ...lbdv1.BackendState) error {
	var from []lbdv1.BackendState
	for _, st := range []lbdv1.BackendState{
		lbdv1.BackendState_BACKEND_STATE_ACTIVE, lbdv1.BackendState_BACKEND_STATE_DRAINING, lbdv1.BackendState_BACKEND_STATE_DISABLED,
	} {
		if !slices.Contains(refuse, st) {
			from = append(from, st)
		}
	}
	req := &lbdv1.UpdateBackendRequest{
		Backend:        &lbdv1.Backend{State: to},
		UpdateMask:     &fieldmaskpb.FieldMask{Paths: []string{"state"}},
		OnlyFromStates: from,
	}
	err := a.updateBackend(ctx, service, addrPort, req, label(to, "active"))
	if status.Code(err) != codes.FailedPrecondition {
		return err
	}
	// Refused: say which state the backend is in, as read now.
	lb, lerr := a.lb()
	if lerr != nil {
		return err
	}
	got, gerr := lb.GetBackend(ctx, &lbdv1.GetBackendRequest{ServiceName: service, Address: req.Backend.Address, Port: req.Backend.Port})
	if gerr != nil || !slices.Contains(refuse, got.Backend.GetState()) {
		return err
	}
	return &stateRefusedError{
		msg: fmt.Sprintf("backend %s of service %q is %s: '%s' does not apply",
			formatEndpoint(req.Backend.Address, req.Backend.Port), service, label(got.Backend.State, "active"), use),
		state: got.Backend.State,
	}
}

// stateRefusedError says that a backend was left alone because of the state it is in.
type stateRefusedError struct {
	msg   string
	state lbdv1.BackendState
}

func (e *stateRefusedError) Error() string { return e.msg }

func (a *app) backendSetWeightCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "set-weight SERVICE ADDR:PORT WEIGHT",
		Short: "Change a backend's relative weight (1-256)",
		Long: `Change a backend's relative weight, 1 to 256: its share of new flows is its weight over
the sum of the weights of the usable backends. 0 is refused (lbd answers
InvalidArgument): to send a backend no new flows, drain it.`,
		Args:              exactArgs("SERVICE", "ADDR:PORT", "WEIGHT"),
		ValidArgsFunction: a.completeArgs(a.completeServices, a.completeBackends),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			w, err := strconv.ParseUint(args[2], 10, 32)
			if err != nil {
				return usageErrorf("weight %q is not a number", args[2])
			}
			req := &lbdv1.UpdateBackendRequest{
				Backend:    &lbdv1.Backend{Weight: uint32(w)},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"weight"}},
			}
			return a.updateBackend(ctx, args[0], args[1], req, "weight "+args[2])
		}),
	}
}

func (a *app) backendSetQUICServerIDCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "set-quic-server-id SERVICE ADDR:PORT HEX",
		Short: "Change the QUIC server ID a backend encodes in its connection IDs",
		Long: `Change the QUIC server ID (hex, the service's quic server ID length in bytes) that the
backend's QUIC server encodes in the connection IDs it chooses; "" removes it, and the
backend's QUIC packets are then balanced by their 5-tuple. Packets that carry the former
ID fall back to the 5-tuple: change a server's ID together with its configuration.`,
		Example:           "  lbctl backend set-quic-server-id h3 198.18.1.12:443 0c03",
		Args:              exactArgs("SERVICE", "ADDR:PORT", "HEX"),
		ValidArgsFunction: a.completeArgs(a.completeServices, a.completeBackends),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			sid, err := hex.DecodeString(args[2])
			if err != nil {
				return usageErrorf("server ID %q is not hex", args[2])
			}
			req := &lbdv1.UpdateBackendRequest{
				Backend:    &lbdv1.Backend{QuicServerId: sid},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"quic_server_id"}},
			}
			return a.updateBackend(ctx, args[0], args[1], req, "QUIC server ID "+quicID(sid))
		}),
	}
}

// quicID is a QUIC server ID in hex, "none" if empty.
func quicID(sid []byte) string {
	if len(sid) == 0 {
		return "none"
	}
	return hex.EncodeToString(sid)
}

// updateBackend sends req for the backend at addrPort of service. req names the fields
// it changes (update mask), so the server keeps the others as they are, whatever another
// client changed meanwhile: no read-modify-write.
func (a *app) updateBackend(ctx context.Context, service, addrPort string, req *lbdv1.UpdateBackendRequest, done string) error {
	ap, err := parseAddrPort(addrPort)
	if err != nil {
		return err
	}
	lb, err := a.lb()
	if err != nil {
		return err
	}
	req.ServiceName = service
	req.Backend.Address, req.Backend.Port = ap.Addr().String(), uint32(ap.Port())
	resp, err := lb.UpdateBackend(ctx, req)
	if err != nil {
		return err
	}
	return a.printDone(resp.Backend, "backend %s of service %q: %s", ap, service, done)
}

// writeBackendTable writes one row per backend. SHARE is the backend's part of the Maglev
// table, the part of new flows it gets; QUIC-ID, where a backend has one, the server ID
// its QUIC server encodes in its connection IDs.
func writeBackendTable(w io.Writer, bs []*lbdv1.Backend) {
	var slots uint64
	quic := false
	for _, b := range bs {
		slots += uint64(b.TableSlots)
		quic = quic || len(b.QuicServerId) > 0
	}
	t := newTable(w)
	head := []any{"ADDRESS", "PORT", "NODE", "WEIGHT", "STATE", "HEALTH", "SLOTS", "SHARE"}
	if quic {
		head = append(head, "QUIC-ID")
	}
	row(t, head...)
	for _, b := range bs {
		share := "-"
		if slots > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(b.TableSlots)/float64(slots))
		}
		h := b.GetHealth()
		health := label(h.GetState(), "-")
		if h.GetState() == lbdv1.HealthState_HEALTH_STATE_DOWN {
			health = withReason(health, h.GetLastResult())
		}
		cells := []any{b.Address, formatPort(b.Port), dash(b.NodeAddress), b.Weight, label(b.State, "active"),
			health, b.TableSlots, share}
		if quic {
			cells = append(cells, dash(hex.EncodeToString(b.QuicServerId)))
		}
		row(t, cells...)
	}
	t.Flush()
}
