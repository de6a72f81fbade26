package lbd

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestFlags: lbd's flags on cobra keep their names and meanings: double and single dash
// (as Go's flag package took them), repeatable lists with commas, overrides of the
// file's values, --help on stdout, and errors naming the flag.
func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--role", "lb", "--interface", "eth0,eth1", "--interface", "eth2", "--hash-seed", "7", "--state-dir", "/tmp/x", "--log-json"},
		{"-role", "lb", "-interface=eth0, eth1", "-interface", "eth2", "-hash-seed=7", "-state-dir", "/tmp/x", "-log-json"},
	} {
		var out bytes.Buffer
		cfg, check, err := parseFlags(args, &out)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if check || !slices.Equal(cfg.Roles, []string{"lb"}) || !slices.Equal(cfg.Datapath.Interfaces, []string{"eth0", "eth1", "eth2"}) ||
			cfg.Datapath.HashSeed != 7 || cfg.StateDir != "/tmp/x" || !cfg.Log.JSON {
			t.Errorf("%q: check %v, config %+v", args, check, cfg)
		}
	}
	for _, args := range [][]string{{"--help"}, {"-help"}, {"-h"}} {
		var out bytes.Buffer
		if _, _, err := parseFlags(args, &out); !errors.Is(err, errHelp) || !strings.Contains(out.String(), "--check-config") {
			t.Errorf("%q: %v, help %q", args, err, out.String())
		}
	}
	if _, _, err := parseFlags([]string{"-version"}, &bytes.Buffer{}); !errors.Is(err, errVersion) {
		t.Errorf("-version: %v", err)
	}
	for args, want := range map[string]string{
		"--bogus":                 "unknown flag: --bogus",
		"--hash-seed 4294967296":  "--hash-seed: 4294967296 does not fit 32 bits",
		"--role lb extra":         "unexpected arguments: extra",
		"--conntrack-size banana": "conntrack-size",
	} {
		if _, _, err := parseFlags(strings.Fields(args), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", args, err, want)
		}
	}
}
