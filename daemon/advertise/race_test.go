//go:build race

package advertise

// raceEnabled is true under the race detector; see newTestRouter.
const raceEnabled = true
