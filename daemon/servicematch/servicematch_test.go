package servicematch

import (
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	s, err := Compile([]string{"web", "payments/*", "*/dns/53/udp/*", "a.b", "web"})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"web":                                true,
		"web2":                               false,
		"payments/":                          true,
		"payments/api/http/tcp/203.0.113.1":  true,
		"payment/api":                        false,
		"kube-system/dns/53/udp/2001:db8::1": true,
		"kube-system/dns/53/tcp/2001:db8::1": false,
		"a.b":                                true,
		"axb":                                false, // "." is not a wildcard
	} {
		if got := s.Match(name); got != want {
			t.Errorf("Match(%q) = %v, want %v", name, got, want)
		}
	}
	if got := strings.Join(s.Names(), ","); got != "web,a.b" {
		t.Errorf("Names() = %s, want web,a.b", got)
	}
	var zero Set
	if !zero.Empty() || zero.Match("web") {
		t.Error("the zero Set must be empty and match nothing")
	}
	if e, _ := Compile(nil); !e.Empty() {
		t.Error("an empty list must give an empty Set")
	}
}

func TestCompileRejectsEmptyEntry(t *testing.T) {
	_, err := Compile([]string{"web", " "})
	if err == nil || !strings.Contains(err.Error(), "[1]") {
		t.Fatalf("Compile with a blank entry: %v, want an error naming [1]", err)
	}
}
