//go:build !race

package bgp

// raceEnabled is true under the race detector; see newTestRouter.
const raceEnabled = false
