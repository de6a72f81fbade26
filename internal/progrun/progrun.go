// Package progrun runs a BPF program once through BPF_PROG_TEST_RUN with the raw system
// call, for what cilium/ebpf's Program.Run does not give: the kernel's own duration, the
// live-frame flags, and a run cut short by a signal left to the caller to resume.
package progrun

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Attr is union bpf_attr as BPF_PROG_TEST_RUN reads it. Data and context pointers are
// addresses: the caller keeps what they point to alive until Run returns.
type Attr struct {
	ProgFD      uint32
	Retval      uint32
	DataSizeIn  uint32
	DataSizeOut uint32
	DataIn      uint64
	DataOut     uint64
	Repeat      uint32
	Duration    uint32
	CtxSizeIn   uint32
	CtxSizeOut  uint32
	CtxIn       uint64
	CtxOut      uint64
	Flags       uint32
	CPU         uint32
	BatchSize   uint32
	_           uint32
}

// Run makes the call; the kernel fills in Retval, DataSizeOut and Duration. It returns
// the errno as is (unix.EINTR when a signal interrupted the run).
func Run(a *Attr) error {
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(a)), unsafe.Sizeof(*a))
	if errno != 0 {
		return errno
	}
	return nil
}

// OnOneCPU runs fn on the calling goroutine's thread, locked to it and pinned to one
// of the CPUs the thread may use, and gives the thread back with its CPUs: per-CPU
// state a program keeps (counters, a sampler's phase) then sees every run fn makes,
// even where the kernel lets a long run migrate between its repeats.
func OnOneCPU(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("progrun: CPUs of the thread: %w", err)
	}
	cpu := 0
	for cpu < 8*int(unsafe.Sizeof(old)) && !old.IsSet(cpu) {
		cpu++
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return fmt.Errorf("progrun: run on CPU %d: %w", cpu, err)
	}
	defer unix.SchedSetaffinity(0, &old)
	return fn()
}
