//go:build race

package nixl

// raceBuild is true in binaries built with -race; see raceWorkaround.
const raceBuild = true
