package backendtc

//go:generate go tool bpf2go -tags linux -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I../include -I." -type nat_key -type nat_val -type lpm_key -type config -type counter -type betc_default -type betc_nat_flag -type lbd_mon_state -type lbd_mon_flag -type lbd_mon_hook -type lbd_mon_snaplen -type lbd_mon_event backendtc backendtc.c
