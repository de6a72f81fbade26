//go:build !race

package bgptest

// raceEnabled is true under the race detector; see NewRouter.
const raceEnabled = false
