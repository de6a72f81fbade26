package lbxdp

// The generated *_bpfel.go/.o files are committed so that building lbd needs no
// clang. Regenerate with `go generate ./bpf/lbxdp/` after changing the C sources.
// The benchmark harness is generated into _test files: it is not part of lbd.
//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I../include" -type lb_vip_key -type lb_vip -type lb_service_key -type lb_service -type lb_svc_entry -type lb_vip_bitmap -type lb_backend -type lb_ct_key -type lb_ct4_key -type lb_ct -type lb_aff_key -type lb_aff -type lb_src_key -type lb_counter -type lb_config -type lb_route -type lbd_mon_state -type lb_quic_key -type lb_svc_flag -type lb_drop_reason -type lb_quic_route -type lb_ct_state -type lb_ct_flag -type lb_ct_event -type lbd_mon_flag -type lbd_mon_hook -type lb_default -type lb_quic_sid -type lb_trace_magic -type lbd_mon_snaplen -type lb_vip_filter_order -type lb_table_layout -type lb_trace_meta -type lbd_mon_event lbxdp lbxdp.c
//go:generate go tool bpf2go -tags linux -target bpfel -output-suffix _test -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I../include" -type bw_template benchwrap bench_wrap.c
