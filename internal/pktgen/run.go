package pktgen

import (
	"testing"

	"github.com/cilium/ebpf"
)

// outRoom is how much a program may grow a frame: encapsulation adds at most 94 bytes
// and an ICMP error quotes at most 128 bytes of the packet it answers.
const outRoom = 512

// Prog runs frames through a loaded BPF program with BPF_PROG_TEST_RUN.
type Prog struct {
	Program *ebpf.Program
	// Context, when set, gives the context the program sees for a frame: for XDP an
	// xdp_md with data_end and the ingress ifindex that bpf_fib_lookup needs.
	Context func(frame []byte) any
	// Within, when set, makes the call: the helpers that look up routes use the
	// network namespace of the calling thread, so a test passes one that enters its
	// namespace (nsdo.Run).
	Within func(run func()) error
}

// Try runs the program once on frame and returns its return value and the frame it
// left behind.
func (p Prog) Try(frame []byte) (uint32, []byte, error) {
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+outRoom)}
	if p.Context != nil {
		opts.Context = p.Context(frame)
	}
	var (
		ret uint32
		err error
	)
	run := func() { ret, err = p.Program.Run(&opts) }
	if p.Within == nil {
		run()
	} else if ierr := p.Within(run); ierr != nil {
		return 0, nil, ierr
	}
	return ret, opts.DataOut, err
}

// Run is Try that fails the test on an error.
func (p Prog) Run(tb testing.TB, frame []byte) (uint32, []byte) {
	tb.Helper()
	ret, out, err := p.Try(frame)
	if err != nil {
		tb.Fatalf("run %v: %v", p.Program, err)
	}
	return ret, out
}

// Case is one test of a BPF program: a packet in, the state it meets, the verdict the
// program must return and what the packet out must be. E is what the test's Setup and
// Check work on (a loaded datapath, a topology); V is the type of the verdict.
type Case[E any, V ~uint32] struct {
	Name    string
	In      []byte                                    // the frame the program gets
	Setup   func(t *testing.T, env E)                 // optional: state before the run
	Verdict V                                         // the program's return value
	Check   func(t *testing.T, env E, in, out []byte) // optional: the frame it left
}

// Run runs each case as a subtest. env gives the case's environment and the program
// under test: a fresh datapath per case, or one that the cases share.
func Run[E any, V ~uint32](t *testing.T, env func(t *testing.T) (E, Prog), cases []Case[E, V]) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			e, prog := env(t)
			if c.Setup != nil {
				c.Setup(t, e)
			}
			ret, out := prog.Run(t, c.In)
			if V(ret) != c.Verdict {
				t.Errorf("verdict %v, want %v", V(ret), c.Verdict)
			}
			if c.Check != nil {
				c.Check(t, e, c.In, out)
			}
		})
	}
}
