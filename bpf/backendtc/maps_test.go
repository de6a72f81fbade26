//go:build linux

package backendtc

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
)

func TestCounterNames(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range AllCounters() {
		name := c.String()
		if name == "" || seen[name] {
			t.Errorf("counter %d has name %q (empty or duplicate)", c, name)
		}
		seen[name] = true
	}
	// The Go list is as long as the C enum: CNT_MAX sizes the counters map.
	spec, err := Spec(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n := spec.Maps[backendtcMapBetcCounters].MaxEntries; n != uint32(numCounters) {
		t.Errorf("the C enum has %d counters, the Go list %d", n, numCounters)
	}
}

func TestNATKeyRoundTrip(t *testing.T) {
	for _, k := range []NATKey{
		{Proto: ProtoTCP, Backend: backendV4, Client: clientV4},
		{Proto: ProtoUDP, Backend: backendV6, Client: clientV6},
	} {
		raw, err := natKey(k)
		if err != nil {
			t.Fatal(err)
		}
		e := natEntry(raw, backendtcNatVal{}, time.Now(), 0)
		if e.NATKey != k {
			t.Errorf("round trip of %+v gave %+v", k, e.NATKey)
		}
	}
	if _, err := natKey(NATKey{Proto: ProtoTCP, Backend: backendV4, Client: clientV6}); err == nil {
		t.Error("mixed-family key accepted")
	}
}

func TestExpired(t *testing.T) {
	e := NATEntry{Idle: 2 * time.Minute}
	if e.Expired(time.Hour, time.Minute) {
		t.Error("open entry idle 2m expired with a 1h idle timeout")
	}
	e.Closing = true
	if !e.Expired(time.Hour, time.Minute) {
		t.Error("closing entry idle 2m not expired with a 1m closing timeout")
	}
}

func TestAllowedSources(t *testing.T) {
	d := newDatapath(t)
	extra := netip.MustParsePrefix("198.18.7.0/28")
	if err := d.AddAllowedSource(netip.MustParsePrefix("198.18.7.5/28")); err != nil {
		t.Fatal(err)
	}
	got, err := d.AllowedSources()
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{allowedV4, allowedV6, extra}
	sortPrefixes(got)
	sortPrefixes(want)
	if !slices.Equal(got, want) {
		t.Errorf("allowed %v, want %v (host bits masked)", got, want)
	}
	if err := d.DeleteAllowedSource(extra); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteAllowedSource(extra); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
	if err := d.SetConfig(Config{VNI: 1 << 24}); err == nil {
		t.Error("25-bit VNI accepted")
	}
}

func sortPrefixes(ps []netip.Prefix) {
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
}

// TestPinnedMapsAdopted loads twice on one bpffs directory, as a restarted daemon
// would: the second load sees the first one's NAT entries, allow list and config.
func TestPinnedMapsAdopted(t *testing.T) {
	// A private bpffs, so the test needs no system mount and leaves nothing behind.
	dir := testnet.BPFFS(t)

	first, err := Load(Options{PinDir: dir, NATMaxEntries: 1024, Config: &Config{VNI: 9}})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.AddAllowedSource(allowedV4); err != nil {
		t.Fatal(err)
	}
	enc := v4Encap(pktgen.DSROption(vipV4))
	enc.VNI = 9
	if v, _ := run(t, first.IngressProgram(), enc.Frame(tcpSyn.request())); v != verdictNext {
		t.Fatalf("verdict %#x", v)
	}
	first.Close()

	second, err := Load(Options{PinDir: dir, NATMaxEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if c, err := second.Config(); err != nil || c.VNI != 9 {
		t.Errorf("adopted config %+v, %v; want VNI 9", c, err)
	}
	if e, err := second.LookupNAT(NATKey{Proto: ProtoTCP, Backend: backendV4, Client: clientV4}); err != nil || e.VIP != vipV4 {
		t.Errorf("adopted NAT entry %+v, %v", e, err)
	}
	if n, err := second.DeleteNAT([]NATKey{
		{Proto: ProtoUDP, Backend: backendV4, Client: clientV4}, // absent: skipped
		{Proto: ProtoTCP, Backend: backendV4, Client: clientV4},
	}); err != nil || n != 1 {
		t.Errorf("batch delete: %d, %v; want 1 deleted", n, err)
	}
	if _, err := Load(Options{PinDir: dir, NATMaxEntries: 2048}); err == nil {
		t.Error("a pinned NAT table of another size was adopted")
	}
}
