package lbctl

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/reflect/protoreflect"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// choiceFlag is a string flag restricted to a fixed set of values, so a typo is a usage
// error at parse time and shells can complete the values.
type choiceFlag struct {
	target  *string
	choices []string
}

func (f *choiceFlag) String() string { return *f.target }

func (f *choiceFlag) Set(s string) error {
	if !slices.Contains(f.choices, s) {
		return fmt.Errorf("must be one of %s", strings.Join(f.choices, ", "))
	}
	*f.target = s
	return nil
}

// Type is what the help shows after the flag name: the choices themselves.
func (f *choiceFlag) Type() string { return strings.Join(f.choices, "|") }

// addChoice defines a choice flag on fs (a flag set of cmd) and its shell completion.
func addChoice(cmd *cobra.Command, fs *pflag.FlagSet, target *string, name, short, def, usage string, choices ...string) {
	*target = def
	fs.VarP(&choiceFlag{target: target, choices: choices}, name, short, usage)
	// The flag was just defined on cmd, so registration cannot fail.
	_ = cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(choices, cobra.ShellCompDirectiveNoFileComp))
}

// addEnumChoice defines a choice flag whose values are the labels of a proto enum.
func addEnumChoice(cmd *cobra.Command, target *string, name, usage string, e protoreflect.Enum) {
	addChoice(cmd, cmd.Flags(), target, name, "", "", usage, enumLabels(e.Descriptor())...)
}

// Enum labels are the proto value names without the type prefix, in lower case with
// hyphens: PROTOCOL_TCP is "tcp", HASH_MODE_SOURCE_ADDRESS is "source-address". They are
// what flags accept and what tables show.

func enumPrefix(ed protoreflect.EnumDescriptor) string {
	var b strings.Builder
	name := string(ed.Name())
	for i, r := range name {
		if i > 0 && r >= 'A' && r <= 'Z' {
			prev := name[i-1]
			if prev >= 'a' && prev <= 'z' || prev >= '0' && prev <= '9' {
				b.WriteByte('_')
			}
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String()) + "_"
}

func valueLabel(ed protoreflect.EnumDescriptor, vd protoreflect.EnumValueDescriptor) string {
	s := strings.TrimPrefix(string(vd.Name()), enumPrefix(ed))
	return strings.ToLower(strings.ReplaceAll(s, "_", "-"))
}

// enumLabels lists the labels of an enum's values, the unspecified zero value excepted.
func enumLabels(ed protoreflect.EnumDescriptor) []string {
	var out []string
	vals := ed.Values()
	for i := range vals.Len() {
		if vd := vals.Get(i); vd.Number() != 0 {
			out = append(out, valueLabel(ed, vd))
		}
	}
	return out
}

// enumNumber is the number of the value with the given label (checked by choiceFlag).
func enumNumber(ed protoreflect.EnumDescriptor, label string) protoreflect.EnumNumber {
	vals := ed.Values()
	for i := range vals.Len() {
		if vd := vals.Get(i); valueLabel(ed, vd) == label {
			return vd.Number()
		}
	}
	return 0
}

// label is the label of e, or def for the zero value. Numbers this build does not know
// (a newer server) are shown as numbers.
func label(e protoreflect.Enum, def string) string {
	if e.Number() == 0 {
		return def
	}
	vd := e.Descriptor().Values().ByNumber(e.Number())
	if vd == nil {
		return strconv.Itoa(int(e.Number()))
	}
	return valueLabel(e.Descriptor(), vd)
}

// parseAddrPort parses a backend's "addr:port", "[v6addr]:port" in the IPv6 case.
func parseAddrPort(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, usageErrorf("%q is not address:port (IPv6 as [address]:port)", s)
	}
	return ap, nil
}

// parseBackendSpec parses a --backend value:
// addr:port[,node=ADDR][,weight=N][,state=S][,quic-id=HEX].
func parseBackendSpec(spec string) (*lbdv1.Backend, error) {
	parts := strings.Split(spec, ",")
	ap, err := parseAddrPort(parts[0])
	if err != nil {
		return nil, err
	}
	b := &lbdv1.Backend{Address: ap.Addr().String(), Port: uint32(ap.Port())}
	stateDesc := lbdv1.BackendState(0).Descriptor()
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return nil, usageErrorf("--backend %q: %q is not key=value", spec, kv)
		}
		switch k {
		case "node":
			b.NodeAddress = v
		case "weight":
			w, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, usageErrorf("--backend %q: weight %q is not a number", spec, v)
			}
			if w == 0 {
				return nil, usageErrorf("--backend %q: weight 0 is not a weight (1-256); add the backend with state=draining to send it no new flows", spec)
			}
			b.Weight = uint32(w)
		case "state":
			if !slices.Contains(enumLabels(stateDesc), v) {
				return nil, usageErrorf("--backend %q: state must be one of %s", spec, strings.Join(enumLabels(stateDesc), ", "))
			}
			b.State = lbdv1.BackendState(enumNumber(stateDesc, v))
		case "quic-id":
			id, err := hex.DecodeString(v)
			if err != nil {
				return nil, usageErrorf("--backend %q: quic-id %q is not hex", spec, v)
			}
			b.QuicServerId = id
		default:
			return nil, usageErrorf("--backend %q: unknown key %q (node, weight, state, quic-id)", spec, k)
		}
	}
	return b, nil
}
