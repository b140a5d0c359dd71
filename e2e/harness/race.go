package harness

// RaceBuilt reports whether the binaries the harness starts are built with
// -race: their memory is then several times what a release build uses.
func RaceBuilt() bool { return raceEnabled }
