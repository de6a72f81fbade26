package socklb

// The generated *_bpfel.go/.o files are committed so that building lbd needs no
// clang. Regenerate with `go generate ./bpf/socklb/` after changing the C sources
// (socklb.c, socklb.h, or lbxdp's lbxdp.h and lbstate.h, which it includes).
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I../include -I../lbxdp" -type sk_rev_key -type sk_rev -type sk_udp_key -type sk_udp -type sk_aff_key -type sk_aff -type sk_stat -type sk_default socklb socklb.c
