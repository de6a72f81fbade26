// Package health actively probes backends and decides whether each may take
// new flows.
//
// The daemon builds one Target per backend from the service's health check
// spec, hands the full set to Checker.Set whenever it changes, and reacts to
// the Transitions the Checker pushes (rebuilding Maglev tables, updating BGP
// advertisements). Checker.Status and Checker.Statuses feed the API, lbctl
// and metrics.
//
// # States
//
// A target is UNKNOWN, UP or DOWN. UP and UNKNOWN targets are usable
// (Status.Usable). An UP or UNKNOWN target goes DOWN after Fall consecutive
// failed probes; a DOWN target comes back after Rise consecutive successes,
// unless flap damping holds it (see Damping). A new target starts UNKNOWN
// (usable; InitialUnknown explains why) unless its spec says InitialDown.
// Targets without a health check (KindNone) are always UP.
//
// # Cost
//
// Each target has one goroutine parked on a timer; probes start at a random
// point of the first interval, then every interval ±10%, on a 25 ms grid so
// that the runtime wakes once per handful of probes. Probes are plain
// connects (TCP) or one HTTP/1.1 request per connection, closed with RST so
// the prober keeps no TIME_WAIT sockets. BenchmarkProbe1000 measures the
// cost of 1,000 targets at 1 s.
package health
