package xdpgen

// The generated *_bpfel.go/.o files are committed so that building needs no clang.
// Regenerate with `go generate ./internal/xdpgen/` after changing xdpgen.c.
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I../../bpf/include" -type xg_config -type xg_state -type xg_counts xdpgen xdpgen.c
