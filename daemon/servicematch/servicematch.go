// Package servicematch selects services by name: a list of exact names and patterns in
// which * stands for any run of characters, "/" included ("payments/*" is every
// service whose name starts with "payments/"). The metrics' allow-list of services and
// GetStats' service filter use it.
package servicematch

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Set is a compiled list of names and patterns. The zero Set matches nothing.
type Set struct {
	names   map[string]bool
	pattern *regexp.Regexp
	literal []string // the exact names, in the list's order
}

// Compile checks and compiles a list. An empty entry is an error naming its index.
func Compile(list []string) (Set, error) {
	s := Set{names: map[string]bool{}}
	var alts []string
	for i, e := range list {
		switch {
		case strings.TrimSpace(e) == "":
			return Set{}, fmt.Errorf("[%d]: empty name", i)
		case strings.Contains(e, "*"):
			alts = append(alts, strings.ReplaceAll(regexp.QuoteMeta(e), `\*`, `.*`))
		default:
			if !s.names[e] {
				s.literal = append(s.literal, e)
			}
			s.names[e] = true
		}
	}
	if len(alts) > 0 {
		re, err := regexp.Compile(`^(?:` + strings.Join(alts, "|") + `)$`)
		if err != nil {
			// QuoteMeta leaves nothing the parser could refuse but a pattern too large.
			return Set{}, errors.Join(errors.New("patterns too large"), err)
		}
		s.pattern = re
	}
	return s, nil
}

// Empty reports whether the list had no entry.
func (s Set) Empty() bool { return len(s.names) == 0 && s.pattern == nil }

// Match reports whether name is one of the names or matches one of the patterns.
func (s Set) Match(name string) bool {
	return s.names[name] || (s.pattern != nil && s.pattern.MatchString(name))
}

// Names returns the exact names of the list (not the patterns), in its order, without
// repeats: a caller can tell which of them match nothing.
func (s Set) Names() []string { return s.literal }
