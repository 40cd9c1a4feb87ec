//go:build !race

package nixl

const raceBuild = false
