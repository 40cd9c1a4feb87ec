//go:build race

package layout

const raceEnabled = true
